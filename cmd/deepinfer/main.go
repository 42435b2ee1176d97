// Command deepinfer runs the DeepInfer-Go engine.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "deepinfer:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "deepinfer",
		Short:         "An LLM inference engine built as a pipeline of stages",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newGraphCmd(), newGenerateCmd(), newEvalCmd(), newServeCmd(), newBenchCmd())
	return root
}
