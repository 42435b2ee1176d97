//go:build nomodel

package assets

import "embed"

// files is empty in a binary built with the tag nomodel (38 MB smaller):
// such a binary runs models from directories only, and DefaultModelDir
// and ExtractTo say so.
var files embed.FS

const embedded = false
