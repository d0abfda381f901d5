package report

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// Reason says why specs fail or are skipped on both sides: every spec whose
// full text contains Substring.
type Reason struct {
	Substring string
	Text      string
	Line      int // in the file it came from
}

// Reasons are tried in order; the first whose Substring a spec's text
// contains applies.
type Reasons []Reason

// reasonSep separates a reason file line's substring from its reason.
const reasonSep = " => "

// ParseReasons reads a reasons file: one "substring => reason" a line, the
// substring matched against a spec's full text (case-sensitive, the first
// matching line wins), blank lines and lines starting with # ignored. An
// entry without a substring or reason, or a substring given twice, is an
// error.
func ParseReasons(r io.Reader) (Reasons, error) {
	var out Reasons
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sub, text, ok := strings.Cut(line, reasonSep)
		sub, text = strings.TrimSpace(sub), strings.TrimSpace(text)
		if !ok || sub == "" || text == "" {
			return nil, fmt.Errorf("reasons line %d: want %q", n, "substring"+reasonSep+"reason")
		}
		if prev, dup := seen[sub]; dup {
			return nil, fmt.Errorf("reasons line %d: substring %q given on line %d already", n, sub, prev)
		}
		seen[sub] = n
		out = append(out, Reason{Substring: sub, Text: text, Line: n})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// match returns the index of the first reason for the spec text, or -1.
func (rs Reasons) match(text string) int {
	for i, r := range rs {
		if strings.Contains(text, r.Substring) {
			return i
		}
	}
	return -1
}
