// Package stages holds the step loop's stage implementations, each
// registered in the pipeline's default registry under its slot and a name:
//
//	requests     default   Source[*engine.Request]: requests submitted to the engine
//	tokenize     default   *engine.Request -> *engine.Sequence: encode, validate, answer bad requests
//	schedule     default   Planner: *engine.Sequence in, *StepOutputs back, *ScheduledStep out
//	prepare      default   *ScheduledStep -> *PreparedStep: flat ids, positions, slot mapping, block tables in backend memory
//	forward      default   *PreparedStep -> *ForwardResult: the model over the paged KV cache, logits of the sampling rows
//	sample       default   *ForwardResult -> *SampledStep: penalties, temperature, top-k/p, min-p, seeded draws, logprobs
//	sample       greedy    *ForwardResult -> *SampledStep: argmax only, ignoring sampling params
//	postprocess  default   *SampledStep -> *StepOutputs: append tokens, stop checks, detokenize, emit outputs
//	logit-softcap default  *ForwardResult -> *ForwardResult: cap*tanh(logit/cap), an example of an inserted stage
//
// Every factory takes a *Runtime as its pipeline.Args.Deps: the engine's
// shared objects (scheduler, model, backend, tokenizer).
package stages
