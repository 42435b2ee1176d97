package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/llm"
)

func newGraphCmd() *cobra.Command {
	var configPath, format string
	cmd := &cobra.Command{
		Use:   "graph",
		Short: "Print the resolved stage graph of a config (Mermaid or DOT)",
		Long: "graph resolves a config's step loop (which implementation fills each slot, inserted stages,\n" +
			"the loop's in-flight bound) and prints it as a Mermaid flowchart or a Graphviz DOT graph.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(configPath)
			if err != nil {
				return err
			}
			spec, err := llm.Spec(cfg)
			if err != nil {
				return err
			}
			topo := spec.Topology()
			switch format {
			case "mermaid":
				fmt.Fprint(cmd.OutOrStdout(), topo.Mermaid(nil))
			case "dot":
				fmt.Fprint(cmd.OutOrStdout(), topo.DOT(nil))
			default:
				return fmt.Errorf("graph: --format must be mermaid or dot, got %q", format)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&configPath, "config", "c", "configs/default.yaml", "engine config (YAML)")
	cmd.Flags().StringVar(&format, "format", "mermaid", "output format: mermaid or dot")
	return cmd
}
