// Package server is the OpenAI-compatible HTTP API over an llm.Engine.
//
// Endpoints:
//
//	POST /v1/completions        prompt (text, text array, token ids, arrays of token ids) -> completions
//	POST /v1/chat/completions   messages rendered with the tokenizer's chat template -> completions
//	GET  /v1/models             the served model
//	GET  /health                200 while serving, 503 while shutting down
//	GET  /metrics               Prometheus metrics (vLLM's names with the prefix "deepinfer:")
//
// Both generation endpoints accept vLLM's request fields (max_tokens,
// temperature, top_p, top_k, min_p, n, stop, stop_token_ids, seed,
// presence/frequency/repetition penalties, logprobs, top_logprobs,
// logit_bias, ignore_eos, min_tokens, skip_special_tokens, ...) and stream
// as server-sent events with "stream": true, ending with the usage chunk
// when stream_options.include_usage is set and "data: [DONE]". Errors use
// the OpenAI error shape {"error": {"message", "type", "param", "code"}}:
// 400 for a bad request (malformed JSON, unknown or mistyped fields, values
// out of range, a prompt that does not fit max_model_len), 404 for an
// unknown model or route, 405 for a wrong method, 401 for a missing or
// wrong API key (Options.APIKey), 408 for a body that stalls past the body
// read timeout, 413 for an oversized body, 415 for a body not sent as
// application/json, 503 (with Retry-After) when the admission bound is
// reached or the server shuts down, 500 when generation fails. Unknown
// fields are refused rather than ignored: a misspelt sampling field would
// otherwise pass unnoticed.
//
// Structured output (structured.go): response_format ("text",
// "json_object", "json_schema"), vLLM's guided_json, guided_regex,
// guided_choice and guided_grammar, and their current form
// structured_outputs, on both endpoints; at most one constraint per
// request. The engine compiles it; one that does not compile is a 400
// naming the field. Tool calling (tools.go) on the chat endpoint: tools
// reach the chat template (or, when the template ignores them, the system
// prompt in the Hermes format); tool_choice "auto" parses Hermes
// <tool_call> blocks from the text, "required" and a named function
// constrain the output to valid calls; the answer carries
// message.tool_calls (streamed as delta.tool_calls) and finish_reason
// "tool_calls". Conversations may hold assistant tool_calls and tool
// results.
//
// Browsers: CORS is off unless Options.AllowedOrigins lists origins, and
// only JSON bodies are accepted, so a web page cannot post a generation
// without a preflight. Slow clients are bounded by header, body and idle
// timeouts and a cap on connections (Options).
//
// A client that disconnects has its requests aborted at once: their KV
// blocks return to the cache. Admission is bounded (Options.MaxPending),
// so a burst is refused with 503 instead of queueing without limit.
// Shutdown drains: the listener stays open and new generation requests
// get 503 with Retry-After while in-flight ones finish (until its context
// ends, when the rest are aborted); then the listener closes.
package server
