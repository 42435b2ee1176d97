//go:build !nomodel

package assets

import "embed"

//go:embed deepseek-tiny
var files embed.FS

// embedded: the model's files are in the binary.
const embedded = true
