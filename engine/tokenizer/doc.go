// Package tokenizer loads Hugging Face tokenizer.json files and encodes and
// decodes text exactly as the Hugging Face tokenizers library does.
//
// Supported: the BPE model (byte-level as in GPT-2, Llama 3 and Qwen2/Qwen3;
// SentencePiece-style with byte_fallback as in Llama 2 and Mistral), the
// normalizers NFC/NFD/NFKC/NFKD, Lowercase, Prepend, Replace, Strip and
// Sequence, the pre-tokenizers Split, ByteLevel, Metaspace, Digits,
// WhitespaceSplit and Sequence, the post-processors TemplateProcessing,
// ByteLevel and Sequence, and the decoders ByteLevel, Metaspace, Replace,
// ByteFallback, Fuse, Strip and Sequence. Added and special tokens are matched
// before normalization and pre-tokenization, with their lstrip, rstrip,
// single_word and normalized flags. Anything else fails at load with an error
// that names the component (ErrUnsupported).
//
// For untrusted input, Tokenizer.EncodePlain encodes special-token strings
// as plain text (HF's split_special_tokens), Tokenizer.EncodeWithBudget stops
// as soon as a text needs more ids than a limit, and Tokenizer.MaxTokenBytes
// bounds the text one id stands for, so an over-long text can be refused
// before encoding.
//
// On top of encode and decode the package provides incremental
// detokenization for streaming (DecodeStream), stop-string detection across
// token boundaries (StopChecker) and chat templates rendered from
// tokenizer_config.json (Tokenizer.ApplyChatTemplate).
//
// A Tokenizer is immutable after load and safe for concurrent use; its only
// shared mutable state is an internal, lock-protected cache of encoded
// pre-token pieces.
package tokenizer
