package server

import (
	"bytes"
	"encoding/json"
)

// StreamOptions are the options of a streamed answer.
type StreamOptions struct {
	// IncludeUsage adds a last chunk, before [DONE], with no choices and
	// the usage of the whole request.
	IncludeUsage bool `json:"include_usage"`
	// ContinuousUsageStats adds the usage so far to every chunk (vLLM).
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

// SamplingFields are the sampling fields both endpoints accept: OpenAI's
// and vLLM's extensions, with vLLM's names, ranges and defaults.
type SamplingFields struct {
	Temperature       *float32           `json:"temperature"`
	TopP              *float32           `json:"top_p"`
	TopK              *int               `json:"top_k"`
	MinP              *float32           `json:"min_p"`
	N                 *int               `json:"n"`
	Seed              *int64             `json:"seed"`
	Stop              StopField          `json:"stop"`
	StopTokenIDs      []int              `json:"stop_token_ids"`
	PresencePenalty   *float32           `json:"presence_penalty"`
	FrequencyPenalty  *float32           `json:"frequency_penalty"`
	RepetitionPenalty *float32           `json:"repetition_penalty"`
	LogitBias         map[string]float32 `json:"logit_bias"`
	IgnoreEOS         bool               `json:"ignore_eos"`
	MinTokens         int                `json:"min_tokens"`
	SkipSpecialTokens *bool              `json:"skip_special_tokens"`
	// IncludeStopStrInOutput is accepted only false: stop strings are
	// never included in the output text.
	IncludeStopStrInOutput bool `json:"include_stop_str_in_output"`
	// SpacesBetweenSpecialTokens is accepted for compatibility and has no
	// effect: the tokenizer's decoder decides spacing.
	SpacesBetweenSpecialTokens *bool `json:"spaces_between_special_tokens"`
	// PromptLogprobs asks for the log-probabilities of the prompt tokens
	// (non-streamed answers only).
	PromptLogprobs *int `json:"prompt_logprobs"`
	// ReturnTokensAsTokenIDs spells logprob tokens as "token_id:N".
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids"`
	// AddSpecialTokens applies the tokenizer's BOS/EOS template when
	// encoding the prompt (default: true for completions, false for chat).
	AddSpecialTokens *bool `json:"add_special_tokens"`
	// User, Priority and RequestID are accepted and ignored (Priority must be 0).
	User      string `json:"user"`
	Priority  int    `json:"priority"`
	RequestID string `json:"request_id"`
	// Structured output (see structured.go): OpenAI's response_format,
	// vLLM's guided_* fields and their current form structured_outputs; at
	// most one constraint in all. guided_whitespace_pattern is refused.
	ResponseFormat          json.RawMessage `json:"response_format"`
	GuidedJSON              json.RawMessage `json:"guided_json"`
	GuidedRegex             json.RawMessage `json:"guided_regex"`
	GuidedChoice            json.RawMessage `json:"guided_choice"`
	GuidedGrammar           json.RawMessage `json:"guided_grammar"`
	GuidedWhitespacePattern json.RawMessage `json:"guided_whitespace_pattern"`
	StructuredOutputs       json.RawMessage `json:"structured_outputs"`
	TruncatePromptTokens    *int            `json:"truncate_prompt_tokens"`
}

// CompletionRequest is the body of POST /v1/completions.
type CompletionRequest struct {
	Model string `json:"model"`
	// Prompt is a string, an array of strings, an array of token ids or an
	// array of arrays of token ids; each prompt is one engine request with
	// N choices.
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *StreamOptions  `json:"stream_options"`
	// Logprobs is the number of top log-probabilities per token (0..20).
	Logprobs *int `json:"logprobs"`
	// Echo, Suffix and BestOf are accepted only at their defaults.
	Echo   bool    `json:"echo"`
	Suffix *string `json:"suffix"`
	BestOf *int    `json:"best_of"`
	SamplingFields
}

// ChatMessage is one message of a chat request as it arrives: role,
// content (a string, null or an array of text parts) and any further
// fields the chat template may read, in their order.
type ChatMessage = json.RawMessage

// ChatCompletionRequest is the body of POST /v1/chat/completions.
type ChatCompletionRequest struct {
	Model               string         `json:"model"`
	Messages            []ChatMessage  `json:"messages"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *StreamOptions `json:"stream_options"`
	Logprobs            bool           `json:"logprobs"`
	TopLogprobs         *int           `json:"top_logprobs"`
	// Tools are function definitions: {"type": "function", "function":
	// {"name", "description", "parameters", "strict"}}; they reach the chat
	// template as its tools variable (see tools.go).
	Tools json.RawMessage `json:"tools"`
	// ToolChoice is "none", "auto" (the default with tools), "required" or
	// {"type": "function", "function": {"name": ...}}.
	ToolChoice json.RawMessage `json:"tool_choice"`
	// ParallelToolCalls false allows at most one call per answer.
	ParallelToolCalls *bool `json:"parallel_tool_calls"`
	// AddGenerationPrompt ends the prompt with the assistant's header (default true).
	AddGenerationPrompt *bool `json:"add_generation_prompt"`
	// ContinueFinalMessage leaves the last (assistant) message open.
	ContinueFinalMessage bool `json:"continue_final_message"`
	// ChatTemplateKwargs are extra variables of the chat template.
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
	// Echo is accepted only false.
	Echo bool `json:"echo"`
	// Metadata, Store and ServiceTier are accepted and ignored.
	Metadata    json.RawMessage `json:"metadata"`
	Store       *bool           `json:"store"`
	ServiceTier *string         `json:"service_tier"`
	SamplingFields
}

// StopField is the "stop" field: null, a string or an array of strings.
type StopField []string

// UnmarshalJSON accepts a string or an array of strings.
func (s *StopField) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if string(data) == "null" {
		*s = nil
		return nil
	}
	if len(data) > 0 && data[0] == '"' {
		var one string
		if err := json.Unmarshal(data, &one); err != nil {
			return &fieldError{"stop", "expected a string or an array of strings"}
		}
		*s = StopField{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(data, &many); err != nil {
		return &fieldError{"stop", "expected a string or an array of strings"}
	}
	*s = many
	return nil
}

// Usage counts the tokens of a request.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails says how many prompt tokens the prefix cache served.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// CompletionLogprobs are a completion choice's log-probabilities, in the
// legacy completions shape: one entry per generated token.
type CompletionLogprobs struct {
	TextOffset    []int                `json:"text_offset"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	Tokens        []string             `json:"tokens"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
}

// PromptLogprob is one candidate of a prompt position (vLLM's shape).
type PromptLogprob struct {
	Logprob      float32 `json:"logprob"`
	Rank         *int    `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// CompletionChoice is one choice of a completion or of a streamed chunk.
type CompletionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *CompletionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
	// StopReason is the stop string (a string) or stop token id (a number)
	// that ended the choice, null otherwise (vLLM).
	StopReason any `json:"stop_reason"`
	// PromptLogprobs has one entry per prompt token, the first null (vLLM).
	PromptLogprobs []map[string]PromptLogprob `json:"prompt_logprobs,omitempty"`
}

// CompletionResponse is the answer of /v1/completions, and each streamed
// chunk of it (the same object, with text deltas).
type CompletionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}

// TopLogprob is one candidate token of a chat logprob entry.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// ChatTokenLogprob is one generated token of a chat choice with its
// log-probability and the top candidates.
type ChatTokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float32      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// ChatLogprobs are a chat choice's log-probabilities.
type ChatLogprobs struct {
	Content []ChatTokenLogprob `json:"content"`
}

// ChatResponseMessage is the assistant's message of a chat choice: its
// content is null when the answer is tool calls alone.
type ChatResponseMessage struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ChatDelta is the delta of a streamed chat chunk: the fields present are
// what the chunk adds.
type ChatDelta struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is a call of one of the request's tools. In a message it has
// an id, the type "function" and the whole arguments; in a streamed delta
// it has its index, and the first delta of a call carries the id, type
// and name, later ones only further arguments.
type ToolCall struct {
	Index    *int             `json:"index,omitempty"`
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"`
	Function ToolCallFunction `json:"function"`
}

// ToolCallFunction is the function of a tool call: its name and its
// arguments, a JSON object as a string.
type ToolCallFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int                 `json:"index"`
	Message      ChatResponseMessage `json:"message"`
	Logprobs     *ChatLogprobs       `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
	StopReason   any                 `json:"stop_reason"`
}

// ChatCompletionResponse is the answer of /v1/chat/completions.
type ChatCompletionResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage"`
}

// ChatChunkChoice is one choice of a streamed chat chunk.
type ChatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        ChatDelta     `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	StopReason   any           `json:"stop_reason,omitempty"`
}

// ChatCompletionChunk is one streamed chunk of a chat completion.
type ChatCompletionChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   *Usage            `json:"usage,omitempty"`
}

// ModelCard describes the served model in GET /v1/models.
type ModelCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	Root        string `json:"root"`
	MaxModelLen int    `json:"max_model_len"`
	// VocabSize is the model's vocabulary size (an extension: clients that
	// send token-id prompts use it).
	VocabSize int `json:"vocab_size"`
}

// ModelList is the answer of GET /v1/models.
type ModelList struct {
	Object string      `json:"object"`
	Data   []ModelCard `json:"data"`
}
