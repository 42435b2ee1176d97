// End-to-end check of the server with the official OpenAI Node client.
// Usage: node openai_e2e.cjs BASE_URL MODEL API_KEY   (BASE_URL ends in /v1)
// Exits 0 when every check passes; prints each failure and exits 1 otherwise.
'use strict';

const { OpenAI, AuthenticationError, BadRequestError, NotFoundError } = require('openai');

const [baseURL, model, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

const failures = [];
const passed = [];
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

const greedy = { temperature: 0, ignore_eos: true };
const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'say something' }];

async function main() {
  await section('models', async () => {
    const page = await client.models.list();
    check('models.list ids', page.data.length === 1 && page.data[0].id === model && page.data[0].object === 'model', page.data);
  });

  let completionText = '';
  await section('completion', async () => {
    const c = await client.completions.create({ model, prompt: 'the quick brown fox', max_tokens: 16, ...greedy });
    completionText = c.choices[0].text;
    check('completion object', c.object === 'text_completion' && typeof c.id === 'string' && c.model === model, c);
    check('completion choice', c.choices.length === 1 && c.choices[0].index === 0 && typeof c.choices[0].text === 'string' && c.choices[0].text.length > 0, c.choices);
    check('completion finish_reason', c.choices[0].finish_reason === 'length', c.choices[0]);
    check('completion usage', c.usage.completion_tokens === 16 && c.usage.prompt_tokens > 0 && c.usage.total_tokens === c.usage.prompt_tokens + 16, c.usage);
  });

  let chatText = '';
  await section('chat', async () => {
    const c = await client.chat.completions.create({ model, messages, max_tokens: 12, ...greedy });
    chatText = c.choices[0].message.content;
    check('chat object', c.object === 'chat.completion' && c.model === model, c);
    check('chat message', c.choices.length === 1 && c.choices[0].message.role === 'assistant' && typeof chatText === 'string' && chatText.length > 0, c.choices);
    check('chat finish_reason', c.choices[0].finish_reason === 'length', c.choices[0]);
    check('chat usage', c.usage.completion_tokens === 12 && c.usage.prompt_tokens > 0, c.usage);
  });

  await section('completion stream', async () => {
    const stream = await client.completions.create({
      model, prompt: 'the quick brown fox', max_tokens: 16, ...greedy, stream: true, stream_options: { include_usage: true },
    });
    let text = '', finish = null, usage = null, chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      if (chunk.usage) usage = chunk.usage;
      for (const ch of chunk.choices) {
        text += ch.text;
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    check('completion stream chunks', chunks > 2, `${chunks} chunks`);
    check('completion stream text', text === completionText, { streamed: text, whole: completionText });
    check('completion stream finish', finish === 'length', finish);
    check('completion stream usage', usage && usage.completion_tokens === 16, usage);
  });

  await section('chat stream', async () => {
    const stream = await client.chat.completions.create({
      model, messages, max_tokens: 12, ...greedy, stream: true, stream_options: { include_usage: true },
    });
    let text = '', role = null, finish = null, usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const ch of chunk.choices) {
        if (ch.delta.role) role = ch.delta.role;
        if (ch.delta.content) text += ch.delta.content;
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    check('chat stream role', role === 'assistant', role);
    check('chat stream text', text === chatText, { streamed: text, whole: chatText });
    check('chat stream finish', finish === 'length', finish);
    check('chat stream usage', usage && usage.completion_tokens === 12, usage);
  });

  await section('n = 2', async () => {
    const c = await client.chat.completions.create({ model, messages, max_tokens: 6, n: 2, temperature: 1, seed: 3, ignore_eos: true });
    check('n = 2 choices', c.choices.length === 2 && c.choices[0].index === 0 && c.choices[1].index === 1, c.choices);
    check('n = 2 usage', c.usage.completion_tokens === 12, c.usage);
    const s = await client.completions.create({ model, prompt: 'abc', max_tokens: 4, n: 2, ignore_eos: true, stream: true });
    const seen = new Map();
    for await (const chunk of s) for (const ch of chunk.choices) seen.set(ch.index, (seen.get(ch.index) || '') + ch.text);
    check('n = 2 streamed indices', seen.size === 2 && seen.has(0) && seen.has(1), [...seen.keys()]);
  });

  await section('stop string', async () => {
    if (completionText.length < 8 || chatText.length < 6) {
      throw new Error(`greedy texts too short to cut with a stop string: ${JSON.stringify([completionText, chatText])}`);
    }
    const stop = completionText.slice(5, 8);
    const want = completionText.slice(0, completionText.indexOf(stop));
    const c = await client.completions.create({ model, prompt: 'the quick brown fox', max_tokens: 16, ...greedy, stop: [stop] });
    check('stop text', c.choices[0].text === want, { got: c.choices[0].text, want, stop });
    check('stop finish_reason', c.choices[0].finish_reason === 'stop', c.choices[0]);
    const s = await client.chat.completions.create({ model, messages, max_tokens: 12, ...greedy, stop: chatText.slice(4, 6) });
    check('chat stop text', s.choices[0].message.content === chatText.slice(0, chatText.indexOf(chatText.slice(4, 6))) && s.choices[0].finish_reason === 'stop', s.choices[0]);
  });

  await section('logprobs', async () => {
    const c = await client.completions.create({ model, prompt: 'hello', max_tokens: 5, logprobs: 2, ...greedy });
    const lp = c.choices[0].logprobs;
    check('completion logprobs shape', lp && lp.tokens.length === 5 && lp.token_logprobs.length === 5 && lp.top_logprobs.length === 5 && lp.text_offset.length === 5, lp);
    check('completion logprobs values', lp && lp.token_logprobs.every((x) => typeof x === 'number' && x <= 0) && lp.tokens.join('') === c.choices[0].text, lp);
    const chat = await client.chat.completions.create({ model, messages, max_tokens: 4, logprobs: true, top_logprobs: 3, ...greedy });
    const content = chat.choices[0].logprobs && chat.choices[0].logprobs.content;
    check('chat logprobs shape', content && content.length === 4 && content.every((e) => typeof e.token === 'string' && e.logprob <= 0 && Array.isArray(e.bytes) && e.top_logprobs.length === 3), content);
    check('chat logprobs greedy', content && content.every((e) => e.top_logprobs[0].logprob === e.logprob), content);
  });

  await section('errors', async () => {
    try {
      await client.completions.create({ model, prompt: 'x', max_tokens: -1 });
      check('negative max_tokens rejected', false, 'no error');
    } catch (err) {
      check('negative max_tokens rejected', err instanceof BadRequestError && err.status === 400 && /max_tokens/.test(err.message), String(err));
    }
    try {
      await client.chat.completions.create({ model: 'no-such-model', messages });
      check('unknown model rejected', false, 'no error');
    } catch (err) {
      check('unknown model rejected', err instanceof NotFoundError && err.status === 404, String(err));
    }
  });

  await section('api key', async () => {
    const wrong = new OpenAI({ baseURL, apiKey: apiKey + '-wrong', maxRetries: 0, timeout: 60_000 });
    try {
      await wrong.completions.create({ model, prompt: 'hi', max_tokens: 2 });
      check('wrong api key rejected', false, 'no error');
    } catch (err) {
      check('wrong api key rejected', err instanceof AuthenticationError && err.status === 401 && /API key/.test(err.message), String(err));
    }
  });

  if (failures.length > 0) {
    for (const f of failures) console.error('FAIL', f);
    console.error(`${failures.length} failed, ${passed.length} passed`);
    process.exit(1);
  }
  console.log(`openai-node e2e: ${passed.length} checks passed`);
}

main().catch((err) => {
  console.error('FAIL', err && err.stack ? err.stack : err);
  process.exit(1);
});
