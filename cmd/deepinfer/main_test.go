package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Building without cgo fails with an error that says cgo and a C compiler
// are needed, as its first error, rather than with "undefined: Backend".
func TestBuildWithoutCgoSaysWhy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command without cgo")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	cmd := exec.Command(goBin, "build", "-o", os.DevNull, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatal("the build without cgo succeeded")
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	first := ""
	for _, l := range lines {
		if !strings.HasPrefix(l, "#") {
			first = l
			break
		}
	}
	if !strings.Contains(first, "needs_cgo_and_a_C_compiler") || !strings.Contains(first, "CGO_ENABLED_1") {
		t.Errorf("first error %q does not say cgo is needed:\n%s", first, out)
	}
}
