package cli

import (
	"fmt"
	"os"
	"runtime/pprof"
	"runtime/trace"

	"github.com/spf13/cobra"
)

// hostProfile is the root command's --cpuprofile and --trace: a Go CPU
// profile and a Go execution trace of the whole command, for finding where
// the host's time goes between device steps (read them with go tool pprof
// and go tool trace).
type hostProfile struct {
	cpuPath, tracePath string
	files              []*os.File
}

func (p *hostProfile) addFlags(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&p.cpuPath, "cpuprofile", "", "write a Go CPU profile of the command to this file")
	f.StringVar(&p.tracePath, "trace", "", "write a Go execution trace of the command to this file")
}

// start begins the profiles asked for.
func (p *hostProfile) start() error {
	if p.cpuPath != "" {
		f, err := os.Create(p.cpuPath)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		p.files = append(p.files, f)
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
	}
	if p.tracePath != "" {
		f, err := os.Create(p.tracePath)
		if err != nil {
			return fmt.Errorf("--trace: %w", err)
		}
		p.files = append(p.files, f)
		if err := trace.Start(f); err != nil {
			return fmt.Errorf("--trace: %w", err)
		}
	}
	return nil
}

// stop ends the profiles and closes their files.
func (p *hostProfile) stop() error {
	if p.cpuPath != "" {
		pprof.StopCPUProfile()
	}
	if p.tracePath != "" {
		trace.Stop()
	}
	var first error
	for _, f := range p.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	p.files = nil
	return first
}
