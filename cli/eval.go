package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// ErrNoBOS is returned when windows should start with BOS but the tokenizer
// names no BOS token.
var ErrNoBOS = errors.New("the tokenizer has no BOS token")

// evalResult is the held-out score of a text: per window, the sum of -ln p
// over its scored tokens and their count.
type evalResult struct {
	NumTokens    int       `json:"tokens"`
	NLL          float64   `json:"nll"`
	Loss         float64   `json:"loss"`
	Perplexity   float64   `json:"ppl"`
	WindowNLL    []float64 `json:"window_nll"`
	WindowTokens []int     `json:"window_tokens"`
}

// evalWindows cuts ids into the prompts that score them: with bos >= 0,
// [bos] + each consecutive chunk of window-1 ids, every chunk id scored;
// with bos < 0, consecutive chunks of window ids, each chunk's first id
// unscored (it has no context).
func evalWindows(ids []int, bos, window int) ([][]int, error) {
	if window < 2 {
		return nil, fmt.Errorf("eval: window %d, want >= 2", window)
	}
	step := window
	if bos >= 0 {
		step = window - 1
	}
	var out [][]int
	for i := 0; i < len(ids); i += step {
		end := min(i+step, len(ids))
		w := make([]int, 0, window)
		if bos >= 0 {
			w = append(w, bos)
		}
		w = append(w, ids[i:end]...)
		if len(w) >= 2 {
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("eval: %d tokens leave nothing to score", len(ids))
	}
	return out, nil
}

// scoreWindows runs every window through the engine as one prompt and sums
// the prompt logprobs (each window's tokens after the first). Cost: one
// prefill of every window plus one generated token each; the windows share
// the engine's batches.
func scoreWindows(ctx context.Context, l *llm.LLM, windows [][]int) (evalResult, error) {
	params := engine.DefaultSamplingParams()
	params.Temperature = 0
	params.MaxTokens = 1
	params.IgnoreEOS = true
	zero := 0
	params.PromptLogprobs = &zero
	prompts := make([]llm.Prompt, len(windows))
	for i, w := range windows {
		prompts[i] = llm.Prompt{IDs: w}
	}
	res, err := l.Generate(ctx, prompts, params, nil)
	if err != nil {
		return evalResult{}, fmt.Errorf("eval: %w", err)
	}
	var r evalResult
	for i, c := range res {
		for _, o := range c.Outputs {
			if o.Err != nil {
				return evalResult{}, fmt.Errorf("eval: window %d: %w", i, o.Err)
			}
		}
		w := windows[i]
		if len(c.PromptLogprobs) != len(w)-1 {
			return evalResult{}, fmt.Errorf("eval: window %d: %d prompt logprobs for %d tokens", i, len(c.PromptLogprobs), len(w))
		}
		nll := 0.0
		for j, lp := range c.PromptLogprobs {
			if lp.TokenID != w[j+1] {
				return evalResult{}, fmt.Errorf("eval: window %d: logprob %d is for token %d, want %d", i, j, lp.TokenID, w[j+1])
			}
			nll -= float64(lp.Logprob)
		}
		r.WindowNLL = append(r.WindowNLL, nll)
		r.WindowTokens = append(r.WindowTokens, len(w)-1)
		r.NLL += nll
		r.NumTokens += len(w) - 1
	}
	r.Loss = r.NLL / float64(r.NumTokens)
	r.Perplexity = math.Exp(r.Loss)
	return r, nil
}

// heldOutPerplexity scores text with the engine's model: the text is encoded
// without special tokens and cut by evalWindows (with the tokenizer's BOS
// when useBOS). It returns the score and the text's token ids.
func heldOutPerplexity(ctx context.Context, l *llm.LLM, text string, window int, useBOS bool) (evalResult, []int, error) {
	tok := l.Tokenizer()
	if tok == nil {
		return evalResult{}, nil, fmt.Errorf("eval: the model has no tokenizer")
	}
	bos := -1
	if useBOS {
		id, ok := tok.TokenToID(tok.Config().BOSToken)
		if tok.Config().BOSToken == "" || !ok {
			return evalResult{}, nil, fmt.Errorf("eval: %w (use --bos=false)", ErrNoBOS)
		}
		bos = id
	}
	ids := tok.Encode(text, false)
	windows, err := evalWindows(ids, bos, window)
	if err != nil {
		return evalResult{}, nil, err
	}
	r, err := scoreWindows(ctx, l, windows)
	return r, ids, err
}

func newEvalCmd(reg *pipeline.Registry) *cobra.Command {
	var (
		ef             engineFlags
		file           string
		window         int
		useBOS, asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Held-out perplexity of a text file under the engine's model",
		Long: "eval encodes the file without special tokens, cuts it into windows and scores every window\n" +
			"with the engine's prompt logprobs: with --bos (the default) each window is BOS followed by\n" +
			"window-1 text tokens, all of them scored; without it each window is window text tokens and\n" +
			"its first is not scored. It prints the scored tokens, the mean negative log-likelihood\n" +
			"(nats per token) and the perplexity exp(loss).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("eval: --file is required")
			}
			text, err := os.ReadFile(file)
			if err != nil {
				return fmt.Errorf("eval: %w", err)
			}
			cfg, _, err := ef.load("")
			if err != nil {
				return err
			}
			l, err := llm.NewLLM(cfg, llm.Options{Stages: reg})
			if err != nil {
				return err
			}
			defer l.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			r, _, err := heldOutPerplexity(ctx, l, string(text), window, useBOS)
			if err != nil {
				return err
			}
			return printEval(cmd.OutOrStdout(), file, r, asJSON)
		},
	}
	ef.register(cmd, engineFlagSet{model: true})
	cmd.Flags().StringVarP(&file, "file", "f", "", "text file to score")
	cmd.Flags().IntVar(&window, "window", 256, "tokens per window, BOS included")
	cmd.Flags().BoolVar(&useBOS, "bos", true, "start every window with the tokenizer's BOS token")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result, per-window sums included, as JSON")
	return cmd
}

func printEval(w io.Writer, file string, r evalResult, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		return enc.Encode(r)
	}
	_, err := fmt.Fprintf(w, "%s: %d tokens in %d windows, loss %.4f nats/token, perplexity %.4f\n",
		file, r.NumTokens, len(r.WindowNLL), r.Loss, r.Perplexity)
	return err
}
