package csi

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// maxDriverNameLength is the longest valid CSI driver name, per the CSI
// spec's GetPluginInfo and the CSIDriver object.
const maxDriverNameLength = 63

// ValidateDriverName checks a CSI driver name: non-empty, at most
// maxDriverNameLength characters, and a DNS-1123 subdomain once its ASCII
// letters are lowercased (the CSI spec's rule; it cannot contain "/" or be
// "." or ".."). Only ASCII letters are folded: strings.ToLower would turn
// the Kelvin sign U+212A into "k" and let a non-ASCII name through.
func ValidateDriverName(name string) error {
	switch {
	case name == "":
		return errors.New("CSI driver name is empty")
	case len(name) > maxDriverNameLength:
		return fmt.Errorf("CSI driver name %q... is longer than %d characters", name[:maxDriverNameLength], maxDriverNameLength)
	}
	if errs := validation.IsDNS1123Subdomain(asciiLower(name)); len(errs) > 0 {
		return fmt.Errorf("CSI driver name %q is invalid: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// asciiLower lowercases the ASCII letters of s and leaves every other
// byte as it is.
func asciiLower(s string) string {
	return strings.Map(func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, s)
}
