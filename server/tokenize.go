package server

import (
	"net/http"
	"runtime/debug"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// The utility routes vLLM's server has besides the OpenAI API: /tokenize,
// /detokenize, /version and /v1/models/{id}.

// TokenizeRequest is the body of POST /tokenize: a prompt, or chat
// messages rendered with the chat template (as vLLM's).
type TokenizeRequest struct {
	Model    string        `json:"model,omitempty"`
	Prompt   *string       `json:"prompt,omitempty"`
	Messages []ChatMessage `json:"messages,omitempty"`
	// AddSpecialTokens defaults to true for a prompt and false for
	// messages (the template writes its own).
	AddSpecialTokens *bool `json:"add_special_tokens,omitempty"`
	// AddGenerationPrompt (messages only) defaults to true.
	AddGenerationPrompt *bool `json:"add_generation_prompt,omitempty"`
}

// TokenizeResponse is /tokenize's answer.
type TokenizeResponse struct {
	Count       int   `json:"count"`
	MaxModelLen int   `json:"max_model_len"`
	Tokens      []int `json:"tokens"`
}

// DetokenizeRequest is the body of POST /detokenize.
type DetokenizeRequest struct {
	Model  string `json:"model,omitempty"`
	Tokens []int  `json:"tokens"`
}

// DetokenizeResponse is /detokenize's answer.
type DetokenizeResponse struct {
	Prompt string `json:"prompt"`
}

// VersionResponse is /version's answer.
type VersionResponse struct {
	Version string `json:"version"`
}

// handleTokenize serves POST /tokenize. The work is bounded as a
// completion's prompt is (max_model_len tokens).
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req TokenizeRequest
	if e := decodeRequest(w, r, s.opts.MaxBodyBytes, &req); e != nil {
		writeError(w, e)
		return
	}
	ids, e := s.tokenizeRequest(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, TokenizeResponse{Count: len(ids), MaxModelLen: s.maxModelLen, Tokens: ids})
}

func (s *Server) tokenizeRequest(req *TokenizeRequest) ([]int, *apiError) {
	switch {
	case s.checkModel(req.Model) != nil:
		return nil, s.checkModel(req.Model)
	case s.tok == nil:
		return nil, badRequest("prompt", "the model has no tokenizer")
	case (req.Prompt == nil) == (len(req.Messages) == 0):
		return nil, badRequest("prompt", "give either prompt or messages")
	case req.Prompt != nil:
		addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
		return s.tokenize(promptInput{text: *req.Prompt}, addSpecial, "prompt")
	}
	msgs, e := parseMessages(req.Messages)
	if e != nil {
		return nil, e
	}
	if e := checkRoles(msgs, s.tok.Config()); e != nil {
		return nil, e
	}
	opts := tokenizer.ChatOptions{AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt}
	addSpecial := req.AddSpecialTokens != nil && *req.AddSpecialTokens
	return s.chatPromptIDs(msgs, opts, false, addSpecial)
}

// handleDetokenize serves POST /detokenize.
func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req DetokenizeRequest
	if e := decodeRequest(w, r, s.opts.MaxBodyBytes, &req); e != nil {
		writeError(w, e)
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		writeError(w, e)
		return
	}
	if s.tok == nil {
		writeError(w, badRequest("tokens", "the model has no tokenizer"))
		return
	}
	for i, id := range req.Tokens {
		if id < 0 || id >= s.vocabSize {
			writeError(w, badRequest("tokens", "token %d is %d, outside the vocabulary [0, %d)", i, id, s.vocabSize))
			return
		}
	}
	writeJSON(w, http.StatusOK, DetokenizeResponse{Prompt: s.tok.Decode(req.Tokens, false)})
}

// handleVersion serves GET /version: the module version the binary was
// built from ("(devel)" for a build from a checkout).
func (s *Server) handleVersion(w http.ResponseWriter, _ *http.Request) {
	v := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	writeJSON(w, http.StatusOK, VersionResponse{Version: v})
}

// handleModel serves GET /v1/models/{id}: the served model's card, or 404.
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	if id != s.model {
		writeError(w, &apiError{status: http.StatusNotFound, param: "model", msg: "The model `" + id + "` does not exist. This server serves `" + s.model + "`."})
		return
	}
	writeJSON(w, http.StatusOK, s.modelCard())
}
