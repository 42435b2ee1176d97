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
// unknown model or route, 405 for a wrong method, 413 for an oversized
// body, 503 (with Retry-After) when the admission bound is reached or the
// server shuts down, 500 when generation fails. Unknown fields are refused
// rather than ignored: a misspelt sampling field would otherwise pass
// unnoticed.
//
// A client that disconnects has its requests aborted at once: their KV
// blocks return to the cache. Admission is bounded (Options.MaxPending),
// so a burst is refused with 503 instead of queueing without limit.
// Shutdown drains: it refuses new requests, lets in-flight ones finish
// until its context ends, then aborts the rest.
package server
