// Command tokenban is the deepinfer command line with the ban-tokens stage
// of package tokenban registered: a config can insert it after forward.
package main

import (
	"os"

	"github.com/deepinfer/deepinfer-go/cli"
	"github.com/deepinfer/deepinfer-go/examples/tokenban"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func main() {
	reg := pipeline.DefaultRegistry().Clone()
	tokenban.Register(reg)
	os.Exit(cli.Main(reg))
}
