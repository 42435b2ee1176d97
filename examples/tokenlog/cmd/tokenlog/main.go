// Command tokenlog is the deepinfer command line with the token-log stage
// of package tokenlog registered: a config can insert it after postprocess.
package main

import (
	"os"

	"github.com/deepinfer/deepinfer-go/cli"
	"github.com/deepinfer/deepinfer-go/examples/tokenlog"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func main() {
	reg := pipeline.DefaultRegistry().Clone()
	tokenlog.Register(reg)
	os.Exit(cli.Main(reg))
}
