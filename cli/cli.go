// Package cli holds the deepinfer command line: generate, eval, graph,
// serve and bench. A program that registers stages of its own reuses it
// whole, so that its configs can name those stages:
//
//	func main() {
//		reg := pipeline.DefaultRegistry().Clone() // the built-in stages
//		mystages.Register(reg)
//		os.Exit(cli.Main(reg))
//	}
//
// Every command that builds an engine or a stage graph takes its stage
// implementations from the registry it was given.
package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/pipeline"
)

// Main runs the command line os.Args[1:] with the stages of reg (nil: the
// default registry, which the built-in stages fill at init), prints an
// error as "deepinfer: ..." on standard error, and returns the exit code:
// 0 on success, 1 on any error.
func Main(reg *pipeline.Registry) int {
	root := NewRootCommand(reg)
	root.SetArgs(os.Args[1:])
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "deepinfer:", err)
		return 1
	}
	return 0
}

// NewRootCommand returns the deepinfer root command with every subcommand,
// each building its engines and graphs from reg (nil: the default
// registry). Errors are returned by Execute, not printed (the caller
// reports them, as Main does); usage is not printed on an error.
// --version prints the module version and VCS revision of the binary.
// Building it is cheap (the build information is read once): nothing is
// loaded until a subcommand runs.
func NewRootCommand(reg *pipeline.Registry) *cobra.Command {
	if reg == nil {
		reg = pipeline.DefaultRegistry()
	}
	root := &cobra.Command{
		Use:           "deepinfer",
		Short:         "An LLM inference engine built as a pipeline of stages",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	root.SetVersionTemplate("deepinfer {{.Version}}\n")
	prof := &hostProfile{}
	prof.addFlags(root)
	root.PersistentPreRunE = func(*cobra.Command, []string) error { return prof.start() }
	root.PersistentPostRunE = func(*cobra.Command, []string) error { return prof.stop() }
	root.AddCommand(newGraphCmd(reg), newGenerateCmd(reg), newEvalCmd(reg), newServeCmd(reg), newBenchCmd(reg))
	return root
}
