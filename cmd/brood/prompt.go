package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/pkg/protocol"
)

// promptReadBytesMax bounds what the CLI reads of a prompt from stdin or a
// file (8 MiB). It is only the reader's own guard: the coordinator's limit
// (PromptBytesMax, 256 KiB by default) decides and answers LIMIT_EXCEEDED,
// so this bound stays well above it.
const promptReadBytesMax = 8 << 20

// promptSource is where a verb's prompt (or followup message) comes from:
// the words on the command line, stdin when they are the single word "-",
// or the file --prompt-file names ("-" is stdin too). Reading it from
// stdin or a file lets a prompt exceed the shell's argument limit (issue
// 37, item 4).
type promptSource struct {
	file string // --prompt-file
}

// register adds --prompt-file to cmd.
func (p *promptSource) register(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&p.file, "prompt-file", "",
		"read the "+what+" from this file (\"-\": stdin) instead of the command line; or give \"-\" as the "+what)
}

// read returns the prompt from words (the verb's prompt arguments) or the
// source they name. It refuses with INVALID_ARGUMENT: both words and
// --prompt-file, neither, an unreadable file, a prompt longer than
// promptReadBytesMax, and a prompt that is not UTF-8 (docs/protocol.md
// §3: text is UTF-8; the coordinator refuses it too, for every client).
func (p *promptSource) read(cmd *cobra.Command, words []string, what string) (string, error) {
	var src io.Reader
	name := ""
	switch {
	case p.file != "" && len(words) > 0:
		return "", protocol.Errorf(protocol.CodeInvalidArgument, "give the %s either on the command line or with --prompt-file, not both", what)
	case p.file == "" && len(words) == 0:
		return "", protocol.Errorf(protocol.CodeInvalidArgument, "no %s: give it on the command line, \"-\" for stdin, or --prompt-file FILE", what)
	case p.file == "-" || (p.file == "" && len(words) == 1 && words[0] == "-"):
		src, name = cmd.InOrStdin(), "stdin"
	case p.file != "":
		f, err := os.Open(p.file)
		if err != nil {
			return "", protocol.Errorf(protocol.CodeInvalidArgument, "--prompt-file: %w", err)
		}
		defer f.Close()
		src, name = f, p.file
	default:
		return checkPromptText(strings.Join(words, " "), what, "the command line")
	}
	data, err := io.ReadAll(io.LimitReader(src, promptReadBytesMax+1))
	if err != nil {
		return "", protocol.Errorf(protocol.CodeInvalidArgument, "read the %s from %s: %w", what, name, err)
	}
	if len(data) > promptReadBytesMax {
		return "", protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
			"limit": "prompt bytes", "reason": fmt.Sprintf("the %s from %s is longer than %d bytes", what, name, promptReadBytesMax)})
	}
	return checkPromptText(string(data), what, name)
}

// checkPromptText refuses text that is not UTF-8, naming the first bad byte's offset.
func checkPromptText(s, what, from string) (string, error) {
	if utf8.ValidString(s) {
		return s, nil
	}
	off := 0
	for off < len(s) {
		r, n := utf8.DecodeRuneInString(s[off:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		off += n
	}
	return "", protocol.Errorf(protocol.CodeInvalidArgument, "the %s from %s is not UTF-8 text (first bad byte at offset %d)", what, from, off)
}
