// Package engine holds the inference engine's domain state: sequences and
// their sampling params, the Scheduler that plans each step (waiting,
// prompted and running queues, chunked prefill, preemption by recompute,
// planning ahead for zero-overhead scheduling), the BlockManager of paged
// KV blocks (ref-counted, prefix-cached, copy-on-write for forks), the
// StateManager of per-sequence state slots, and the FlopsEstimator behind
// MFU and bandwidth figures.
//
// The package knows no model, kernel or pipeline stage: a step leaves it as
// SchedulerOutputs plus one SequenceMetadata per sequence, and comes back
// as sampled tokens through Scheduler.ProcessOutputs.
package engine
