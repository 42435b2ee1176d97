package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// samplingFlags binds every sampling parameter to a flag.
type samplingFlags struct {
	p                          engine.SamplingParams
	seed                       int64
	logprobs, promptLogprobs   int
	stopTokenIDs, logitBiasRaw []string
	keepSpecial                bool
	// structured output
	jsonSchemaFile, grammarFile string
	jsonObject                  bool
	regex, whitespace           string
	choices                     []string
}

func (f *samplingFlags) register(cmd *cobra.Command) {
	d := engine.DefaultSamplingParams()
	fl := cmd.Flags()
	fl.IntVarP(&f.p.MaxTokens, "max-tokens", "n", 64, "largest number of tokens to generate per sequence (as llama.cpp's -n)")
	fl.IntVar(&f.p.MinTokens, "min-tokens", 0, "tokens generated before EOS or a stop token may end a sequence")
	fl.IntVar(&f.p.N, "n", d.N, "sequences per prompt")
	fl.Float32VarP(&f.p.Temperature, "temperature", "t", 0, "sampling temperature; 0 is greedy")
	fl.Float32Var(&f.p.TopP, "top-p", d.TopP, "nucleus sampling mass in (0, 1]; 1 is off")
	fl.IntVar(&f.p.TopK, "top-k", d.TopK, "keep the K most likely tokens; 0 or -1 is off")
	fl.Float32Var(&f.p.MinP, "min-p", d.MinP, "drop tokens below min-p times the top probability")
	fl.Float32Var(&f.p.RepetitionPenalty, "repetition-penalty", d.RepetitionPenalty, "penalty for tokens already in prompt or output; 1 is off")
	fl.Float32Var(&f.p.PresencePenalty, "presence-penalty", 0, "subtracted once from tokens present in the output")
	fl.Float32Var(&f.p.FrequencyPenalty, "frequency-penalty", 0, "subtracted per occurrence in the output")
	fl.Int64Var(&f.seed, "seed", -1, "per-request sampling seed; -1 derives one from the config's seed")
	fl.BoolVar(&f.p.IgnoreEOS, "ignore-eos", false, "keep generating past EOS")
	fl.StringArrayVar(&f.p.Stop, "stop", nil, "stop string (repeatable)")
	fl.StringSliceVar(&f.stopTokenIDs, "stop-token-ids", nil, "token ids that end a sequence (comma-separated)")
	fl.StringSliceVar(&f.logitBiasRaw, "logit-bias", nil, "TOKEN=BIAS pairs added to logits (comma-separated)")
	fl.IntVar(&f.logprobs, "logprobs", -1, "log-probabilities to report per generated token; -1 is none")
	fl.IntVar(&f.promptLogprobs, "prompt-logprobs", -1, "log-probabilities to report per prompt token; -1 is none")
	fl.BoolVar(&f.keepSpecial, "keep-special-tokens", false, "keep special tokens in the output text")
	fl.StringVar(&f.jsonSchemaFile, "json-schema", "", "constrain the output to one JSON instance of the JSON Schema in FILE")
	fl.BoolVar(&f.jsonObject, "json-object", false, "constrain the output to a JSON object")
	fl.StringVar(&f.regex, "regex", "", "constrain the output to a full match of this regular expression")
	fl.StringArrayVar(&f.choices, "choice", nil, "constrain the output to one of these strings (repeatable)")
	fl.StringVar(&f.grammarFile, "grammar", "", "constrain the output to the GBNF grammar in FILE (start rule root)")
	fl.StringVar(&f.whitespace, "json-whitespace", "", "whitespace the JSON forms allow: flexible (default), compact or python")
}

// structured returns the structured-output constraint the flags ask for
// (nil: none), reading the schema or grammar file.
func (f *samplingFlags) structured() (*engine.StructuredOutput, error) {
	s := &engine.StructuredOutput{JSONObject: f.jsonObject, Regex: f.regex, Choice: f.choices, Whitespace: f.whitespace}
	for _, file := range []struct {
		flag, path string
		into       *string
	}{{"--json-schema", f.jsonSchemaFile, &s.JSONSchema}, {"--grammar", f.grammarFile, &s.Grammar}} {
		if file.path == "" {
			continue
		}
		data, err := os.ReadFile(file.path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file.flag, err)
		}
		if len(data) == 0 {
			return nil, fmt.Errorf("%s: %s is empty", file.flag, file.path)
		}
		*file.into = string(data)
	}
	if s.Kind() == "" {
		if s.Whitespace != "" {
			return nil, errors.New("--json-whitespace needs --json-schema or --json-object")
		}
		return nil, nil
	}
	return s, nil
}

func (f *samplingFlags) params() (engine.SamplingParams, error) {
	p := f.p
	p.SkipSpecialTokens = !f.keepSpecial
	if f.seed >= 0 {
		s := f.seed
		p.Seed = &s
	}
	if f.logprobs >= 0 {
		n := f.logprobs
		p.Logprobs = &n
	}
	if f.promptLogprobs >= 0 {
		n := f.promptLogprobs
		p.PromptLogprobs = &n
	}
	for _, s := range f.stopTokenIDs {
		id, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return p, fmt.Errorf("--stop-token-ids: %q is not a token id", s)
		}
		p.StopTokenIDs = append(p.StopTokenIDs, id)
	}
	for _, kv := range f.logitBiasRaw {
		k, v, ok := strings.Cut(kv, "=")
		id, err1 := strconv.Atoi(strings.TrimSpace(k))
		bias, err2 := strconv.ParseFloat(strings.TrimSpace(v), 32)
		if !ok || err1 != nil || err2 != nil {
			return p, fmt.Errorf("--logit-bias: %q is not TOKEN=BIAS", kv)
		}
		if p.LogitBias == nil {
			p.LogitBias = map[int]float32{}
		}
		p.LogitBias[id] = float32(bias)
	}
	so, err := f.structured()
	if err != nil {
		return p, err
	}
	p.StructuredOutput = so
	return p, p.Validate(0)
}

func newGenerateCmd(reg *pipeline.Registry) *cobra.Command {
	var (
		promptFile     string
		prompts        []string
		chat, tokenIDs bool
		sf             samplingFlags
		ef             engineFlags
	)
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Generate completions for prompts with the engine (offline)",
		Long: "generate runs prompts through the engine. Prompts come from --prompt (repeatable), --file\n" +
			"(one prompt per line, or JSONL with a \"prompt\" field), or standard input. One prompt streams\n" +
			"its text as it is generated; several show a progress bar and print each completion at the end.\n" +
			"A stats line follows: throughput, queue, KV usage, preemptions and model FLOPs.\n\n" +
			"Without --config and --model it runs the shipped model (deepseek-tiny), from any directory.\n" +
			"--logprobs N prints each generated token's log-probability and its N most likely alternatives\n" +
			"after the text (--prompt-logprobs N the prompt tokens'). A prompt whose length plus\n" +
			"--max-tokens exceeds max_model_len is refused before anything is generated.\n\n" +
			"--json-schema FILE, --json-object, --regex, --choice or --grammar FILE (GBNF) constrain the\n" +
			"output (structured output): the constraint compiles off the step loop, and each step masks\n" +
			"the tokens it does not allow.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			params, err := sf.params()
			if err != nil {
				return err
			}
			cfg, cleanup, err := ef.load("")
			if err != nil {
				return err
			}
			texts, err := readPrompts(prompts, promptFile, cmd.InOrStdin())
			if err != nil {
				cleanup()
				return err
			}
			l, err := llm.NewLLM(cfg, llm.Options{Stages: reg})
			cleanup() // the tokenizer is loaded
			if err != nil {
				return err
			}
			defer l.Close()
			inputs, err := buildPrompts(l.Tokenizer(), texts, chat, tokenIDs)
			if err != nil {
				return err
			}
			if err := checkContext(l, inputs, params.MaxTokens); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			return runGenerate(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), l, inputs, params, !chat)
		},
	}
	ef.register(cmd, engineFlagSet{model: true, chatTemplate: true})
	cmd.Flags().StringArrayVarP(&prompts, "prompt", "p", nil, "prompt text (repeatable)")
	cmd.Flags().StringVarP(&promptFile, "file", "f", "", "file of prompts: one per line, or JSONL with a \"prompt\" field")
	cmd.Flags().BoolVar(&chat, "chat", false, "wrap each prompt as a user message with the tokenizer's chat template (or --chat-template's); the rendered prompt is not printed")
	cmd.Flags().BoolVar(&tokenIDs, "token-ids", false, "prompts are space-separated token ids")
	sf.register(cmd)
	return cmd
}

// readPrompts gathers prompts from flags, a file, or stdin (in that order of preference).
func readPrompts(flags []string, file string, stdin io.Reader) ([]string, error) {
	if len(flags) > 0 {
		return flags, nil
	}
	var r io.Reader = stdin
	name := "standard input"
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("generate: %w", err)
		}
		defer f.Close()
		r, name = f, file
	}
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(text), "{") {
			var rec struct {
				Prompt *string `json:"prompt"`
			}
			if err := json.Unmarshal([]byte(text), &rec); err != nil || rec.Prompt == nil {
				return nil, fmt.Errorf("generate: %s:%d: a JSON line needs a string field \"prompt\"", name, line)
			}
			text = *rec.Prompt
		}
		out = append(out, text)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("generate: %s: %w", name, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("generate: no prompts: give --prompt, --file or lines on standard input")
	}
	return out, nil
}

func buildPrompts(tok *tokenizer.Tokenizer, texts []string, chat, ids bool) ([]llm.Prompt, error) {
	out := make([]llm.Prompt, len(texts))
	for i, text := range texts {
		switch {
		case ids:
			for _, f := range strings.Fields(text) {
				id, err := strconv.Atoi(f)
				if err != nil {
					return nil, fmt.Errorf("generate: prompt %d: %q is not a token id", i+1, f)
				}
				out[i].IDs = append(out[i].IDs, id)
			}
		case chat:
			if tok == nil {
				return nil, fmt.Errorf("generate: --chat needs a tokenizer with a chat template")
			}
			rendered, err := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: text}}, true)
			if err != nil {
				return nil, fmt.Errorf("generate: chat template: %w", err)
			}
			out[i].Text = rendered
		default:
			out[i].Text = text
		}
	}
	return out, nil
}

// runGenerate runs prompts through l with params and prints the result:
// one prompt with n = 1 streams its text as it comes (after the prompt
// when echo is set and the prompt is text), several print each completion
// at the end; then the log-probabilities when params ask for them, and a
// stats line on stderr.
func runGenerate(ctx context.Context, stdout, stderr io.Writer, l *llm.LLM, prompts []llm.Prompt, params engine.SamplingParams, echo bool) error {
	start := time.Now()
	var onToken func(engine.RequestOutput)
	var bar *progressbar.ProgressBar
	stream := len(prompts) == 1 && params.N <= 1
	if stream {
		onToken = func(o engine.RequestOutput) {
			if l.Tokenizer() != nil {
				fmt.Fprint(stdout, o.Text)
			} else {
				for _, id := range o.TokenIDs {
					fmt.Fprintf(stdout, "%d ", id)
				}
			}
		}
		if echo && len(prompts[0].IDs) == 0 {
			fmt.Fprint(stdout, prompts[0].Text)
		}
	} else if isTerminal(stderr) {
		bar = progressbar.NewOptions(len(prompts)*max(1, params.N),
			progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription("generating"),
			progressbar.OptionShowCount(), progressbar.OptionClearOnFinish())
		onToken = func(o engine.RequestOutput) {
			if o.Finished {
				bar.Add(1)
			}
		}
	}
	res, err := l.Generate(ctx, prompts, params, onToken)
	elapsed := time.Since(start)
	if stream {
		fmt.Fprintln(stdout)
		if len(res) == 1 && len(res[0].Outputs) == 1 {
			printLogprobs(stdout, l, "prompt logprobs", 1, res[0].PromptLogprobs)
			printLogprobs(stdout, l, "logprobs", 0, res[0].Outputs[0].Logprobs)
		}
	} else {
		if bar != nil {
			bar.Finish()
		}
		for i, c := range res {
			if len(c.PromptLogprobs) > 0 {
				fmt.Fprintf(stdout, "--- prompt %d ---\n", i+1)
				printLogprobs(stdout, l, "prompt logprobs", 1, c.PromptLogprobs)
			}
			for _, o := range c.Outputs {
				fmt.Fprintf(stdout, "--- prompt %d, output %d (%s) ---\n%s\n", i+1, o.Index, o.FinishReason, outputText(l, o))
				printLogprobs(stdout, l, "logprobs", 0, o.Logprobs)
			}
		}
	}
	failed, total := 0, 0
	for _, c := range res {
		for _, o := range c.Outputs {
			total++
			if o.Err != nil {
				failed++
				fmt.Fprintf(stderr, "%s/%d: %v\n", c.RequestID, o.Index, o.Err)
			}
		}
	}
	fmt.Fprintln(stderr, statsLine(l, elapsed))
	if err == nil && failed > 0 {
		err = fmt.Errorf("generate: %d of %d outputs failed", failed, total)
	}
	return err
}

// printLogprobs writes a title line, then one line per scored token: its
// position (first the position of lps[0]), id, text (quoted; the id
// without a tokenizer), log-probability, and the alternatives the request
// asked for (--logprobs N, --prompt-logprobs N) as "text"=logprob, most
// likely first. Nothing when lps is empty (the flag not given).
func printLogprobs(w io.Writer, l *llm.LLM, title string, first int, lps []engine.TokenLogprobs) {
	if len(lps) == 0 {
		return
	}
	tok := l.Tokenizer()
	text := func(id int) string {
		if tok == nil {
			return strconv.Itoa(id)
		}
		return strconv.Quote(tok.Decode([]int{id}, false))
	}
	fmt.Fprintln(w, title+": position, token id, token, logprob, top alternatives")
	for i, lp := range lps {
		fmt.Fprintf(w, "%4d %6d %-16s %9.4f", first+i, lp.TokenID, text(lp.TokenID), lp.Logprob)
		for _, t := range lp.Top {
			fmt.Fprintf(w, "  %s=%.4f", text(t.TokenID), t.Logprob)
		}
		fmt.Fprintln(w)
	}
}

// checkContext returns an error naming every prompt whose length plus
// maxTokens exceeds the engine's max_model_len (engine.max_model_len, or
// the model's max_position_embeddings), with the largest --max-tokens that
// fits, so that such a run fails up front instead of stopping at the limit
// or failing per prompt. Cost: one tokenization of each text prompt.
func checkContext(l *llm.LLM, prompts []llm.Prompt, maxTokens int) error {
	limit := l.Config().Engine.MaxModelLen
	if limit == 0 {
		limit = l.Model().Config().MaxPositionEmbeddings
	}
	tok := l.Tokenizer()
	var errs []error
	for i, p := range prompts {
		n := len(p.IDs)
		if n == 0 {
			if tok == nil {
				continue
			}
			n = len(tok.Encode(p.Text, true))
		}
		if n+maxTokens <= limit {
			continue
		}
		fix := fmt.Sprintf("give --max-tokens (-n) at most %d, or a larger --max-model-len", limit-n)
		if n >= limit {
			fix = "shorten the prompt, or give a larger --max-model-len"
		}
		errs = append(errs, fmt.Errorf("generate: prompt %d has %d tokens; with --max-tokens %d that is %d, past max_model_len %d: %s",
			i+1, n, maxTokens, n+maxTokens, limit, fix))
	}
	return errors.Join(errs...)
}

func outputText(l *llm.LLM, o llm.CompletionOutput) string {
	if l.Tokenizer() != nil {
		return o.Text
	}
	return fmt.Sprint(o.TokenIDs)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// statsLine summarizes a run: throughput over the wall time (decode: the
// tokens emitted, not the rows verified), speculative
// decoding's acceptance (when drafts were verified), the host time the
// forward passes waited for (with a model drafter's passes, which it does
// not count, beside it), queues, KV usage, preemptions, and the model
// FLOPs rate.
func statsLine(l *llm.LLM, wall time.Duration) string {
	st := l.StepStats()
	ss := l.SchedulerStats()
	secs := wall.Seconds()
	fwd := st.ForwardTime().Seconds()
	gflops := 0.0
	if fwd > 0 {
		gflops = st.FLOPs() / fwd / 1e9
	}
	mfu := "MFU n/a"
	if peak := l.PeakFLOPS(); peak > 0 {
		mfu = fmt.Sprintf("MFU %.1f%% of %.0f GFLOP/s", 100*l.MFU(), peak/1e9)
	}
	zos := "off"
	if l.Config().ZOS.Enabled {
		zos = "on"
	}
	if d := st.MeanDraft(); d > 0 {
		zos += fmt.Sprintf("; drafter passes %s a step, not counted", d.Round(time.Microsecond))
	}
	device := ""
	if d := deviceIdle(st.DeviceTimes()); d != "" {
		device = " | " + d
	}
	steps := fmt.Sprintf("%d steps", st.Steps.Load())
	if g := st.GraphSteps.Load(); g > 0 {
		steps += fmt.Sprintf(" (%d on CUDA graphs%s)", g, graphNodesPart(st.GraphNodes()))
	}
	return fmt.Sprintf("stats: %.2fs, %s | prefill %.1f tok/s, decode %.1f tok/s%s | host time exposed between forwards %s (ZOS %s)%s | running %d, waiting %d | KV %.1f%% of %d blocks | preemptions %d | prefix cache %d/%d tokens | %.2f GFLOP/s in forward, %s (%s, weights %s)",
		secs, steps,
		float64(st.PrefillTokens.Load())/secs, float64(st.DecodeOutputTokens())/secs, specPart(st.Spec()),
		st.MeanExposedHost().Round(time.Microsecond), zos, device, ss.NumRunning, ss.NumWaiting, 100*ss.BlockUsage, ss.NumBlocks, ss.NumPreemptions,
		ss.PrefixCache.NumHitTokens, ss.PrefixCache.NumQueryTokens, gflops, mfu, l.Backend().Name(), models.WeightFormat(l.Model()))
}

// graphNodesPart is the stats line's census of the captured forward
// graphs, "; forward graphs: 131 nodes (1 row) to 158 (64 rows)", or ""
// when the backend does not count them.
func graphNodesPart(g []stages.GraphNodes) string {
	rows := func(n int) string {
		if n == 1 {
			return "1 row"
		}
		return fmt.Sprintf("%d rows", n)
	}
	switch len(g) {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf("; forward graph: %d nodes (%s)", g[0].Nodes, rows(g[0].Rows))
	}
	lo, hi := g[0], g[len(g)-1]
	return fmt.Sprintf("; forward graphs: %d nodes (%s) to %d (%s)", lo.Nodes, rows(lo.Rows), hi.Nodes, rows(hi.Rows))
}

// specPart is the stats line's speculative-decoding part,
// " | spec: accept 0.62, mean len 2.9, per-pos 0.81/0.64/0.47/0.30" (see
// stages.SpecStats.String), or "" when no draft was verified.
func specPart(sp stages.SpecStats) string {
	if sp.NumDrafts <= 0 {
		return ""
	}
	return " | spec: " + sp.String()
}

// specReport describes speculative decoding over a run as vLLM's
// "SpecDecoding metrics" line does: the stats line's summary with the
// accepted and drafted tokens and the drafts; "" when no draft was
// verified.
func specReport(sp stages.SpecStats) string {
	if sp.NumDrafts <= 0 {
		return ""
	}
	return fmt.Sprintf("%s (accepted %d of %d draft tokens, %d drafts)", sp.String(), sp.NumAcceptedTokens, sp.NumDraftTokens, sp.NumDrafts)
}

// deviceIdle describes the device timeline of a run: the share of device
// time between consecutive forward passes that is not forward work, over
// all steps and over decode steps, with the mean device time from one
// step's start to the next. That share is the device's idle time plus
// the work it queues outside the forward pass: sampling, and with
// speculative decoding the acceptance and the drafter's passes, so it is
// named for what it measures. Empty when the backend has no device
// markers (the CPU backend: its forward time is the host's).
func deviceIdle(d stages.DeviceTimes) string {
	switch {
	case !d.Timed && d.Err == "":
		return ""
	case d.Err != "":
		return "device timeline off: " + d.Err
	}
	all, ok := d.All.IdleFraction()
	if !ok {
		return "device outside forward passes n/a (no consecutive steps measured)"
	}
	s := fmt.Sprintf("device outside forward passes %.1f%% of %s/step", 100*all, fmtMillis(d.All.MeanSpan()))
	if dec, ok := d.Decode.IdleFraction(); ok {
		s += fmt.Sprintf(" (decode steps %.1f%% of %s)", 100*dec, fmtMillis(d.Decode.MeanSpan()))
	}
	return s
}

// fmtMillis prints a duration in milliseconds with three decimals.
func fmtMillis(d time.Duration) string {
	return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond))
}
