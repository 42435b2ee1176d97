// Command typical is the deepinfer command line with the typical-p sampler
// of package typical registered: a config can say "sample: typical".
package main

import (
	"os"

	"github.com/deepinfer/deepinfer-go/cli"
	"github.com/deepinfer/deepinfer-go/examples/typical"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func main() {
	reg := pipeline.DefaultRegistry().Clone()
	typical.Register(reg)
	os.Exit(cli.Main(reg))
}
