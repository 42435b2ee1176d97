// End-to-end check of structured output and tool calling with the official
// OpenAI Node client.
// Usage: node openai_structured_e2e.cjs BASE_URL MODEL API_KEY PERSON_SCHEMA TOOLS
//   (BASE_URL ends in /v1; PERSON_SCHEMA is a JSON Schema, TOOLS a JSON array of tools)
// Checks the client's typed and parsed results, prints one line
// "RESULTS <json>" with the outputs for the caller to validate against the
// schemas, and exits 0; prints each failure and exits 1 otherwise.
'use strict';

const { OpenAI, BadRequestError } = require('openai');

const [baseURL, model, apiKey, schemaText, toolsText] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
const schema = JSON.parse(schemaText);
const tools = JSON.parse(toolsText).map((t) => ({ ...t, function: { ...t.function, strict: true } }));
const toolNames = tools.map((t) => t.function.name);

const failures = [];
const passed = [];
const results = { json: [], calls: [] };
function check(name, cond, detail) {
  if (cond) passed.push(name);
  else failures.push(`${name}: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`);
}

async function section(name, fn) {
  try {
    await fn();
  } catch (err) {
    failures.push(`${name}: threw ${err && err.stack ? err.stack : err}`);
  }
}

const messages = [{ role: 'system', content: 'Answer in JSON.' }, { role: 'user', content: 'Describe a user of the system.' }];
const sampling = { max_tokens: 512, temperature: 0.8, seed: 11 };
const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

// checkCalls checks the client's tool calls and records them.
function checkCalls(name, calls, only) {
  check(`${name} tool_calls`, Array.isArray(calls) && calls.length > 0, calls);
  for (const c of calls || []) {
    check(`${name} call shape`, c.type === 'function' && typeof c.id === 'string' && c.id.startsWith('chatcmpl-tool-') &&
      toolNames.includes(c.function.name) && (!only || c.function.name === only) && typeof c.function.arguments === 'string', c);
    let args = null;
    try { args = JSON.parse(c.function.arguments); } catch (err) { /* checked below */ }
    check(`${name} arguments parse`, isObject(args), c.function.arguments);
    results.calls.push({ name: c.function.name, arguments: c.function.arguments });
  }
}

async function main() {
  const responseFormat = { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } };

  await section('response_format json_schema', async () => {
    const c = await client.chat.completions.parse({ model, messages, ...sampling, response_format: responseFormat });
    const m = c.choices[0].message;
    check('json_schema finish_reason', c.choices[0].finish_reason === 'stop', c.choices[0]);
    check('json_schema parsed', isObject(m.parsed) && typeof m.parsed.name === 'string' && Number.isInteger(m.parsed.age), m);
    check('json_schema parsed equals content', JSON.stringify(m.parsed) === JSON.stringify(JSON.parse(m.content)), m);
    results.json.push(m.content);
  });

  await section('response_format json_schema streamed', async () => {
    const stream = client.chat.completions.stream({ model, messages, ...sampling, seed: 12, response_format: responseFormat });
    const c = await stream.finalChatCompletion();
    const m = c.choices[0].message;
    // The stream helper parses only zod formats: the content is checked here.
    let parsed = null;
    try { parsed = JSON.parse(m.content); } catch (err) { /* checked below */ }
    check('json_schema stream content', c.choices[0].finish_reason === 'stop' && isObject(parsed) && typeof parsed.role === 'string', m);
    results.json.push(m.content);
  });

  // An array of calls may go on until max_tokens: the complete calls are
  // answered with finish_reason "length".
  await section('tools required', async () => {
    const c = await client.chat.completions.create({ model, messages, ...sampling, tools, tool_choice: 'required' });
    const ch = c.choices[0];
    check('required finish_reason', ['tool_calls', 'length'].includes(ch.finish_reason), ch);
    check('required content null', ch.message.content === null, ch.message);
    checkCalls('required', ch.message.tool_calls);
  });

  await section('tools required, one call', async () => {
    const c = await client.chat.completions.create({ model, messages, ...sampling, tools, tool_choice: 'required', parallel_tool_calls: false });
    const ch = c.choices[0];
    check('required one call finish_reason', ch.finish_reason === 'tool_calls', ch);
    check('required one call', ch.message.tool_calls && ch.message.tool_calls.length === 1, ch.message);
    checkCalls('required one call', ch.message.tool_calls);
  });

  await section('tools named (parse)', async () => {
    const c = await client.chat.completions.parse({
      model, messages, ...sampling, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
    });
    const calls = c.choices[0].message.tool_calls;
    checkCalls('named', calls, 'get_weather');
    check('named one call', calls && calls.length === 1, calls);
    check('named parsed_arguments', calls && isObject(calls[0].function.parsed_arguments) && typeof calls[0].function.parsed_arguments.city === 'string', calls);
  });

  await section('tools required streamed', async () => {
    const stream = client.chat.completions.stream({ model, messages, ...sampling, seed: 13, tools, tool_choice: 'required' });
    const c = await stream.finalChatCompletion();
    check('required stream finish_reason', ['tool_calls', 'length'].includes(c.choices[0].finish_reason), c.choices[0]);
    checkCalls('required stream', c.choices[0].message.tool_calls);
  });

  await section('tools named streamed', async () => {
    const stream = client.chat.completions.stream({
      model, messages, ...sampling, seed: 14, tools, tool_choice: { type: 'function', function: { name: 'get_time' } },
    });
    const c = await stream.finalChatCompletion();
    checkCalls('named stream', c.choices[0].message.tool_calls, 'get_time');
  });

  await section('errors', async () => {
    try {
      await client.chat.completions.create({ model, messages, max_tokens: 2, response_format: { type: 'xml' } });
      check('bad response_format rejected', false, 'no error');
    } catch (err) {
      check('bad response_format rejected', err instanceof BadRequestError && err.param === 'response_format.type', String(err));
    }
    try {
      await client.chat.completions.create({ model, messages, max_tokens: 2, tools, tool_choice: { type: 'function', function: { name: 'nope' } } });
      check('unknown tool rejected', false, 'no error');
    } catch (err) {
      check('unknown tool rejected', err instanceof BadRequestError && /not one of the tools/.test(err.message), String(err));
    }
  });

  console.log('RESULTS ' + JSON.stringify(results));
  if (failures.length > 0) {
    for (const f of failures) console.error('FAIL', f);
    console.error(`${failures.length} failed, ${passed.length} passed`);
    process.exit(1);
  }
  console.log(`openai-node structured e2e: ${passed.length} checks passed`);
}

main().catch((err) => {
  console.error('FAIL', err && err.stack ? err.stack : err);
  process.exit(1);
});
