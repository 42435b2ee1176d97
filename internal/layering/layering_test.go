// Package layering holds the test of the project's import rule: folders
// form floors, and a package imports only packages on floors below its
// own (or in its own folder), so the picture of the layers has no arrow
// pointing up.
package layering

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/deepinfer/deepinfer-go"

// floors lists the top-level folders from the top floor down. A package in
// a folder may import packages of its own folder and of any folder on a
// lower floor, never one on its own floor (outside its folder) or above.
var floors = [][]string{
	{"cmd", "examples", "tools"},
	{"cli"},
	{"server", "bench"},
	{"llm"},
	{"stages"},
	{"engine"},
	{"kernels"},
	{"pipeline"},
	{"assets"}, // the embedded default model: imports nothing of the project
}

// floorOf returns the floor and folder of a package path inside the module.
func floorOf(pkg string) (floor int, folder string, ok bool) {
	rel, found := strings.CutPrefix(pkg, module+"/")
	if !found {
		return 0, "", false
	}
	folder, _, _ = strings.Cut(rel, "/")
	for i, fs := range floors {
		for _, f := range fs {
			if f == folder {
				return i, folder, true
			}
		}
	}
	return -1, folder, true
}

// TestImportsFlowDown checks every package's non-test imports (go list).
func TestImportsFlowDown(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		pkg, imports := fields[0], fields[1:]
		from, fromFolder, _ := floorOf(pkg)
		if strings.HasPrefix(pkg, module+"/internal/") {
			continue
		}
		if from < 0 {
			t.Errorf("package %s is in folder %q, which no floor lists: add it to floors", pkg, fromFolder)
			continue
		}
		for _, imp := range imports {
			to, toFolder, ours := floorOf(imp)
			if !ours || toFolder == fromFolder {
				continue
			}
			checked++
			if to < 0 {
				t.Errorf("%s imports %s, in folder %q, which no floor lists", pkg, imp, toFolder)
			} else if to <= from {
				t.Errorf("%s (floor %d, %s) imports %s (floor %d, %s): imports must flow down the floors %v",
					pkg, from, fromFolder, imp, to, toFolder, floors)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no import between the project's folders was checked: is go list working?")
	}
}

// TestFloorOf pins the helper on a few paths.
func TestFloorOf(t *testing.T) {
	for _, tc := range []struct {
		pkg    string
		floor  int
		folder string
		ours   bool
	}{
		{module + "/cmd/deepinfer", 0, "cmd", true},
		{module + "/engine/models", 5, "engine", true},
		{module + "/pipeline", 7, "pipeline", true},
		{module + "/nowhere", -1, "nowhere", true},
		{"github.com/spf13/cobra", 0, "", false},
	} {
		floor, folder, ours := floorOf(tc.pkg)
		if floor != tc.floor || folder != tc.folder || ours != tc.ours {
			t.Errorf("floorOf(%s) = %d, %q, %v; want %d, %q, %v", tc.pkg, floor, folder, ours, tc.floor, tc.folder, tc.ours)
		}
	}
}
