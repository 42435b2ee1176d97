package cli

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"

	"github.com/spf13/cobra"
)

// hostProfile is the root command's --cpuprofile, --memprofile and
// --trace: a Go CPU profile, a Go allocation profile and a Go execution
// trace of the whole command, for finding where the host's time and
// allocations go between device steps (read them with go tool pprof and go
// tool trace; the allocation profile's alloc_space and alloc_objects
// sample types count every allocation since the start).
type hostProfile struct {
	cpuPath, memPath, tracePath string
	files                       []*os.File
}

func (p *hostProfile) addFlags(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&p.cpuPath, "cpuprofile", "", "write a Go CPU profile of the command to this file")
	f.StringVar(&p.memPath, "memprofile", "", "write a Go allocation profile of the command to this file when it ends")
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

// stop ends the profiles, writes the allocation profile and closes their
// files.
func (p *hostProfile) stop() error {
	if p.cpuPath != "" {
		pprof.StopCPUProfile()
	}
	var first error
	if p.memPath != "" {
		first = writeAllocs(p.memPath)
	}
	if p.tracePath != "" {
		trace.Stop()
	}
	for _, f := range p.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	p.files = nil
	return first
}

// writeAllocs writes the allocation profile to path (after a GC, so that
// its in-use figures are current).
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	runtime.GC()
	err = pprof.Lookup("allocs").WriteTo(f, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	return nil
}
