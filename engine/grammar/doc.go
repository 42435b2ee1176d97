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
// context (advancing the parser state per byte and skipping a subtree as
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
// Four things keep a context's first use cheap:
//
//   - Shared entries. The walk covers only the context's innermost frames,
//     up to the first named rule that loops or is big (for a JSON string:
//     the character class, the repetition helper and the string rule's
//     closing quote), and its result is cached in the Vocab (bounded to 256
//     MiB), keyed by the structure of that grammar fragment, rules
//     renumbered, cut where a token cannot reach: every grammar compiled
//     against the Vocab shares it (most JSON schemas' string, number and
//     key contents are the same fragments, and a string's maxLength
//     positions look alike past a token's length). The walk records the
//     tokens that leave the fragment and where (for a string, `abc",`);
//     the Compiled's entry for the four-frame context is derived by parsing
//     their remaining bytes from the frames below, once per distinct
//     remainder.
//   - Memoized steps. A walk runs the parser over interned states (frames
//     and stack sets hash-consed), so a state that recurs (a string's
//     character loop, a pattern's partial matches) steps each byte once and
//     a trie node costs a table lookup: a lazily built DFA.
//   - Looping subtrees. A state met often gets every byte's transition;
//     when all the bytes of a trie subtree lead back to it (plain text
//     inside a string), the whole subtree is accepted without a step; a
//     child whose byte no stack takes is skipped without a step too.
//   - Wild first bytes. A context whose top class is wide (64 bytes or
//     more, such as the first character of an additional property name,
//     any but the declared names' first characters) is narrowed from the
//     shared walk of the same fragment with the class taken as every byte:
//     after its first byte a token meets the same state whatever the byte,
//     so the tokens whose first byte is outside the class are dropped
//     (linear in the fewer of the tokens in and out of it). A schema's own
//     exclusion then mostly costs tens of microseconds, not a string walk.
//
// CompileContext and CompileWith bound the start state's walks with a
// context and a budget of parser steps, so a pathological grammar (a huge
// alternation, heavy ambiguity) fails within the caller's deadline.
//
// Measured, single-threaded on one core of an Intel Xeon Processor (2
// threads, shared with other work). go test -run '^$' -bench ComputeMask
// -benchtime=20000x ./engine/grammar/ (Llama 3's 128,256 tokens, a JSON
// value grammar, positions inside a nested object, warm cache): p50 6 µs,
// p99 10 µs per mask. MaskBench, deepinfer bench --mode grammar --data
// <MaskBench data> --tokenizer <Llama 3> (5,697 JSON Schema files, python
// whitespace, 10 s per file): 4,969 passing, 696 compile errors, no
// timeouts, 32 validation and no invalidation errors; time to first mask
// p50 0.75 ms, p90 1.8 ms, p99 8.0 ms; time per mask p50 6 µs, p95 58 µs,
// p99 199 µs (the slow tail: first uses of contexts no earlier grammar met,
// mostly strings of a new length bound, new patterns and the literal
// prefixes of each schema's declared names inside additional property
// names); 25 s for the whole run (769 s with a per-Compiled cache and
// no memoized steps). Compile's trie: about 100 ms once per Vocab.
//
// # Limits
//
// A grammar whose alternatives overlap for long stretches keeps several
// stacks alive, and the cost of a step is linear in their number; heavily
// ambiguous grammars can make that large. Token bytes come from the
// tokenizer's vocabulary (see NewVocab); special tokens other than EOS are
// never allowed. A Vocab's shared entries hold up to 256 MiB (past it,
// arbitrary ones are dropped and recomputed on their next use); a walk's
// memoized states are freed with it. A Vocab also numbers every distinct
// byte class its grammars use (for the signatures), a table that only
// grows (tens of bytes per class).
package grammar
