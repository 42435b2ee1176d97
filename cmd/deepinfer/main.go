// Command deepinfer runs the DeepInfer-Go engine: see package cli for its
// commands.
package main

import (
	"os"

	"github.com/deepinfer/deepinfer-go/cli"
)

func main() { os.Exit(cli.Main(nil)) }
