// Package spec holds the pure algorithms of speculative decoding: a
// proposer that guesses the next tokens without a model (prompt lookup,
// vLLM's "ngram" method), and the verifiers that decide how many of the
// guessed (draft) tokens the target model keeps without changing the
// distribution of what it emits.
//
// One speculative step of a sequence: a proposer drafts K tokens
// d_0..d_{K-1}; the target model scores the context followed by the draft in
// one forward pass, which gives K+1 probability rows p_0..p_K (p_j is the
// target's next-token distribution after the context and d_0..d_{j-1}); a
// verifier keeps a prefix d_0..d_{a-1} and emits one more token of its own,
// so a step emits a+1 tokens, 1 <= a+1 <= K+1.
//
// Verification is lossless: the emitted tokens have exactly the
// distribution the target would give them when decoding one token at a
// time. Two verifiers are offered:
//
//   - RejectionSample, for a drafter that draws d_j from a known
//     distribution q_j (a draft model sampling at temperature > 0); it needs
//     p and q.
//   - VerifyGreedy over tokens sampled independently from p_j, for a
//     deterministic drafter (prompt lookup, a greedy draft model); it needs
//     only the target's sampled tokens, so the engine's ordinary sampler
//     serves as the verifier. With the sampler's own uniform for each
//     position (sampling.Uniform(seed, step+j, sampling.DrawSample)) the
//     emitted tokens are those non-speculative decoding would emit with the
//     same seed, token for token, not only in distribution (see
//     VerifyGreedy).
//
// Randomness is passed in (Uniforms), never drawn from global state, so
// every function here is a pure function of its arguments, and the package
// holds no mutable global state.
package spec
