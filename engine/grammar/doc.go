// Package grammar constrains decoding to a context-free grammar, token by
// token: ParseGBNF (llama.cpp's GBNF) and ParseRegex (a full-match regular
// expression, as vLLM's guided_regex) build a Grammar; NewVocab turns the
// engine's tokenizer into byte strings; Compile binds the two; and each
// sequence gets a Matcher whose ComputeMask gives the tokens allowed next,
// with Commit, Rollback (for speculative decoding), IsAccepting,
// IsTerminated and ForcedBytes (for jump-ahead).
//
// # Algorithm
//
// The grammar is lowered to bytes: literals and character classes become
// byte classes (a code-point class becomes a rule with one alternative per
// UTF-8 byte-range sequence), and repetitions become right-recursive helper
// rules (x* is R ::= x R | ε). Parsing is a nondeterministic pushdown
// automaton, as in llama.cpp's sampler: the state is a set of stacks whose
// top is the next byte class and whose frames are return positions. Calls
// in tail position replace the frame instead of pushing one, so repetition
// does not grow the stack; recursion (nested JSON, $ref) does. Left
// recursion through a call that pushes a frame is rejected at parse time.
// Stacks are persistent (frames in an append-only arena, shared between
// states), so the state after each byte is a small slice, and Rollback is
// truncation.
//
// A mask is not computed by parsing the whole vocabulary each step. As in
// XGrammar's adaptive token-mask cache, tokens are classified once per
// context, where a context is a stack's top position plus the four return
// frames below it: walking the vocabulary's byte trie depth-first from the
// context (advancing a copy of the state per byte and skipping a subtree as
// soon as it dies, so shared prefixes are parsed once), each token is
// accepted (some stack consumes it without leaving the context, or leaves
// it exactly at its end; every continuation below is productive because
// unproductive alternatives are removed), rejected, or uncertain (it leaves
// the context before its end). The entry is cached in the Compiled
// (lock-protected, shared by all matchers). ComputeMask then ORs each
// stack's accepted set (a bitset or, when sparse, an id list) and parses only
// the uncertain tokens against the real stack, again sharing prefixes. With
// four frames of context a JSON grammar has almost no uncertain tokens, so
// a warm mask costs a few bitset ORs of len(mask) words.
//
// Measured (go test -run '^$' -bench ComputeMask ./engine/grammar/, Llama 3's
// 128,256 tokens, a JSON value grammar, positions inside a nested object,
// warm cache, one core of a Xeon): p50 6 µs, p99 49 µs per mask. A context's
// first use costs a trie walk (about 30 ms inside a JSON string, where
// nearly every token is allowed); Compile (the trie, 275k nodes, plus the
// start contexts) about 100 ms.
//
// # Limits
//
// A grammar whose alternatives overlap for long stretches keeps several
// stacks alive, and the cost of a step is linear in their number; heavily
// ambiguous grammars can make that large. Token bytes come from the
// tokenizer's vocabulary (see NewVocab); special tokens other than EOS are
// never allowed.
package grammar
