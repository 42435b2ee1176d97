package bench

import (
	"embed"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The offline benchmark's workloads (OfflineOptions.Workload).
const (
	// WorkloadRandom is nano-vllm's: prompts of random token ids.
	WorkloadRandom = "random"
	// WorkloadProse is passages of held-out text, each continued freely.
	WorkloadProse = "prose"
	// WorkloadEditing is editing requests: a passage, an instruction, and
	// the passage's start again with a few words changed, so that the
	// continuation largely repeats the prompt (see EditingPrompts).
	WorkloadEditing = "editing"
)

// Workloads lists the workload names, the default first.
var Workloads = []string{WorkloadRandom, WorkloadProse, WorkloadEditing}

// corpusFS holds the text workloads' documents: the three documents of the
// default model's held-out sample (testdata/deepseek-tiny/heldout_sample.txt,
// cut where one ends and the next begins): the start of held-out chunks of
// As You Like It, of Go's mime/multipart/multipart.go and of War and Peace.
// The model saw none of it in training.
//
//go:embed corpus/*.txt
var corpusFS embed.FS

// Corpus returns the text workloads' documents, in name order.
func Corpus() []string {
	entries, err := corpusFS.ReadDir("corpus")
	if err != nil {
		panic(err) // the embedded folder always exists
	}
	docs := make([]string, 0, len(entries))
	for _, e := range entries {
		data, err := corpusFS.ReadFile("corpus/" + e.Name())
		if err != nil {
			panic(err)
		}
		docs = append(docs, string(data))
	}
	return docs
}

// EditingSeparator follows the passage of an editing prompt, before the
// passage's edited start.
const EditingSeparator = "\n---\nRewrite the text above, changing only a few words.\n\nRewritten text:\n\n"

// TextWorkloadOptions shape the prompts of the text workloads (ProsePrompts,
// EditingPrompts).
type TextWorkloadOptions struct {
	NumPrompts int
	// MinLen..MaxLen is the passage length in tokens (as Count counts
	// them), drawn uniformly per prompt; a passage never runs past its
	// document, so a document shorter than the length gives all of itself.
	MinLen, MaxLen int
	// NumEdits is the number of words changed in an editing prompt's
	// restart (fewer when the restart has fewer words to change); 0: 3.
	NumEdits int
	Seed     uint64
	// Count returns the number of tokens of a text; nil estimates 3 bytes
	// a token (the default model's tokenizer averages 2.86).
	Count func(string) int
	// Documents are the texts passages are cut from, prompt i from
	// document i mod len(Documents); nil: Corpus().
	Documents []string
}

// TextPrompt is one prompt of a text workload.
type TextPrompt struct {
	Text    string // the prompt
	Passage string // the passage it was built from
	// Restart is the editing prompt's last part: the passage's start with
	// Edits applied; empty in a prose prompt.
	Restart string
	Edits   []Edit // in the order of the restart
}

// Edit is one changed word of an editing prompt: Old at byte offset Pos of
// the passage became New.
type Edit struct {
	Pos      int
	Old, New string
}

// ProsePrompts returns o.NumPrompts passages of o's documents: the model
// continues each freely. Deterministic in o. Cost: O(document length)
// Count calls per document, once.
func ProsePrompts(o TextWorkloadOptions) ([]TextPrompt, error) {
	passages, _, err := passages(o)
	if err != nil {
		return nil, err
	}
	out := make([]TextPrompt, len(passages))
	for i, p := range passages {
		out[i] = TextPrompt{Text: p, Passage: p}
	}
	return out, nil
}

// EditingPrompts returns o.NumPrompts prompts shaped as code-editing or
// rewriting requests: a passage of o's documents, EditingSeparator, and the
// start of the same passage again (its first quarter, ending after a word)
// with o.NumEdits words changed. The model's continuation of such a prompt
// largely repeats the rest of the passage, which is in the prompt: the best
// case of prompt lookup (ngram speculation), given a model that copies. (The
// shipped deepseek-tiny hardly does: greedy, on 16 prompts of the default
// lengths, 13 of its 2855 output bytes continue the passage; what prompt
// lookup finds there is mostly the model repeating itself.) Deterministic
// in o. Cost:
// O(document length) Count calls per document, once.
func EditingPrompts(o TextWorkloadOptions) ([]TextPrompt, error) {
	passages, rng, err := passages(o)
	if err != nil {
		return nil, err
	}
	numEdits := o.NumEdits
	if numEdits <= 0 {
		numEdits = 3
	}
	out := make([]TextPrompt, len(passages))
	for i, p := range passages {
		restart, edits := editStart(p, numEdits, rng)
		out[i] = TextPrompt{Text: p + EditingSeparator + restart, Passage: p, Restart: restart, Edits: edits}
	}
	return out, nil
}

func (o *TextWorkloadOptions) validate() error {
	switch {
	case o.NumPrompts < 1:
		return fmt.Errorf("bench: text workload: num prompts must be >= 1, got %d", o.NumPrompts)
	case o.MinLen < 1 || o.MaxLen < o.MinLen:
		return fmt.Errorf("bench: text workload: passage lengths must satisfy 1 <= min <= max, got %d..%d", o.MinLen, o.MaxLen)
	}
	return nil
}

// passages cuts o.NumPrompts passages from o's documents: prompt i's from
// document i mod len, starting at a paragraph (a line after a blank line,
// or the first), drawn among those with enough text after them for the
// drawn length (the first when none has), and ending with the line that
// reaches it. Lengths are the sums of the lines' counts. It returns the
// generator it drew with, for the edits.
func passages(o TextWorkloadOptions) ([]string, *rand.Rand, error) {
	if err := o.validate(); err != nil {
		return nil, nil, err
	}
	count := o.Count
	if count == nil {
		count = func(s string) int { return (len(s) + 2) / 3 }
	}
	docs := o.Documents
	if docs == nil {
		docs = Corpus()
	}
	type doc struct {
		lines  []string
		counts []int // counts[j]: tokens of lines[j:] (suffix sums)
		starts []int // paragraph starts
	}
	var ds []doc
	for _, text := range docs {
		if strings.TrimSpace(text) == "" {
			continue
		}
		var d doc
		d.lines = strings.SplitAfter(text, "\n")
		if d.lines[len(d.lines)-1] == "" {
			d.lines = d.lines[:len(d.lines)-1]
		}
		d.counts = make([]int, len(d.lines)+1)
		for j := len(d.lines) - 1; j >= 0; j-- {
			d.counts[j] = d.counts[j+1] + count(d.lines[j])
		}
		for j, l := range d.lines {
			if strings.TrimSpace(l) != "" && (j == 0 || strings.TrimSpace(d.lines[j-1]) == "") {
				d.starts = append(d.starts, j)
			}
		}
		ds = append(ds, d)
	}
	if len(ds) == 0 {
		return nil, nil, fmt.Errorf("bench: text workload: no document has text")
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x7e47))
	out := make([]string, o.NumPrompts)
	for i := range out {
		d := ds[i%len(ds)]
		want := o.MinLen + rng.IntN(o.MaxLen-o.MinLen+1)
		var fits []int
		for _, s := range d.starts {
			if d.counts[s] >= want {
				fits = append(fits, s)
			}
		}
		start := d.starts[0]
		if len(fits) > 0 {
			start = fits[rng.IntN(len(fits))]
		}
		end := start
		for end < len(d.lines) && d.counts[start]-d.counts[end] < want {
			end++
		}
		out[i] = strings.TrimRight(strings.Join(d.lines[start:end], ""), "\n") + "\n"
	}
	return out, rng, nil
}

// wordRE matches the words an edit may change: runs of at least three
// letters.
var wordRE = regexp.MustCompile(`\pL{3,}`)

// substitutes are the words edits put in.
var substitutes = []string{
	"quiet", "bright", "river", "letter", "garden", "number", "simple", "window",
	"careful", "silver", "morning", "distant", "record", "yellow", "market", "winter",
}

// editStart returns the start of passage (its first quarter, through the
// end of the word that reaches it, at least one word) with up to n
// distinct words of it changed to substitutes (first letter's case kept),
// and the edits in order.
func editStart(passage string, n int, rng *rand.Rand) (string, []Edit) {
	words := wordRE.FindAllStringIndex(passage, -1)
	if len(words) == 0 {
		cut := max(1, len(passage)/4)
		for cut < len(passage) && !utf8.RuneStart(passage[cut]) {
			cut++
		}
		return passage[:cut], nil
	}
	last := 0 // the restart ends with words[last]
	for last < len(words)-1 && words[last][1] < len(passage)/4 {
		last++
	}
	restart := passage[:words[last][1]]
	picks := rng.Perm(last + 1)
	picks = picks[:min(n, len(picks))]
	chosen := make([]bool, last+1)
	for _, p := range picks {
		chosen[p] = true
	}
	var b strings.Builder
	var edits []Edit
	prev := 0
	for j := 0; j <= last; j++ {
		if !chosen[j] {
			continue
		}
		lo, hi := words[j][0], words[j][1]
		old := passage[lo:hi]
		repl := substitutes[rng.IntN(len(substitutes))]
		for strings.EqualFold(repl, old) {
			repl = substitutes[rng.IntN(len(substitutes))]
		}
		if r, _ := utf8.DecodeRuneInString(old); unicode.IsUpper(r) {
			repl = strings.ToUpper(repl[:1]) + repl[1:]
		}
		b.WriteString(restart[prev:lo])
		b.WriteString(repl)
		prev = hi
		edits = append(edits, Edit{Pos: lo, Old: old, New: repl})
	}
	b.WriteString(restart[prev:])
	return b.String(), edits
}
