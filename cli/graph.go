package cli

import (
	"context"
	"fmt"
	"io"
	"sort"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func newGraphCmd(reg *pipeline.Registry) *cobra.Command {
	var (
		ef                 engineFlags
		format             string
		profile, maxTokens int
	)
	cmd := &cobra.Command{
		Use:   "graph",
		Short: "Print the resolved stage graph of a config (Mermaid or DOT), optionally after a profiling run",
		Long: "graph resolves a config's step loop (which implementation fills each slot, inserted stages,\n" +
			"the loop's in-flight bound), builds it to check that every edge's types fit, and prints it\n" +
			"as a Mermaid flowchart or a Graphviz DOT graph with the type on each edge.\n\n" +
			"With --profile N it loads the model, runs N requests through the engine, and prints the graph\n" +
			"annotated with each stage's items, busy and blocked time, then a table and the bottleneck stage.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "mermaid" && format != "dot" {
				return fmt.Errorf("graph: --format must be mermaid or dot, got %q", format)
			}
			cfg, _, err := ef.load("")
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if profile <= 0 {
				// Checks every registered implementation, option and edge
				// type without loading the model.
				g, err := llm.DryGraph(cfg, reg)
				if err != nil {
					return err
				}
				render(out, format, g.Topology(), nil)
				return nil
			}
			return profileRun(cmd.Context(), out, cfg, reg, format, profile, maxTokens)
		},
	}
	ef.register(cmd, engineFlagSet{model: true})
	cmd.Flags().StringVar(&format, "format", "mermaid", "output format: mermaid or dot")
	cmd.Flags().IntVar(&profile, "profile", 0, "run this many requests first and annotate the graph with where the time went")
	cmd.Flags().IntVar(&maxTokens, "max-tokens", 32, "tokens generated per profiling request")
	return cmd
}

func render(w io.Writer, format string, t pipeline.Topology, stats []pipeline.StageStats) {
	if format == "dot" {
		fmt.Fprint(w, t.DOT(stats))
	} else {
		fmt.Fprint(w, t.Mermaid(stats))
	}
}

// profileRun builds an engine for cfg from reg, runs n requests of random prompt ids (ignore_eos, greedy) and
// prints the annotated graph, the stage table and the bottleneck.
func profileRun(ctx context.Context, w io.Writer, cfg *config.Config, reg *pipeline.Registry, format string, n, maxTokens int) error {
	l, err := llm.NewLLM(cfg, llm.Options{Stages: reg})
	if err != nil {
		return err
	}
	vocab := l.Model().Config().VocabSize
	prompts := make([]llm.Prompt, n)
	for i := range prompts {
		ids := make([]int, 16+i%48)
		for j := range ids {
			ids[j] = (i*7919 + j*104729) % vocab
		}
		prompts[i] = llm.Prompt{IDs: ids}
	}
	params := engine.DefaultSamplingParams()
	params.Temperature, params.MaxTokens, params.IgnoreEOS = 0, maxTokens, true
	if _, err := l.Generate(ctx, prompts, params, nil); err != nil {
		l.Close()
		return err
	}
	g := l.Graph()
	if err := l.Close(); err != nil {
		return err
	}
	stats := g.Stats()
	render(w, format, g.Topology(), stats)
	fmt.Fprintln(w)
	sorted := append([]pipeline.StageStats(nil), stats...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Busy > sorted[j].Busy })
	fmt.Fprint(w, pipeline.FormatStats(sorted))
	if b, ok := pipeline.Bottleneck(stats); ok {
		fmt.Fprintf(w, "bottleneck: %s (busy %s of the run)\n", b.Name, b.Busy.Round(1000))
	}
	return nil
}
