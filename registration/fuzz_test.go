package registration

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/fsutil"
)

// maxDriverName is the longest CSI driver name: 63 characters, per the CSI
// spec's GetPluginInfo and the CSIDriver object.
const maxDriverName = 63

// isDriverName is a CSI driver name by its definition, written out here
// rather than through the validation package: lowercased (ASCII only; the
// CSI spec allows [a-zA-Z0-9] with '-' and '.'), a DNS-1123 subdomain
// (dot-separated labels of [a-z0-9-], each non-empty and beginning and
// ending with a letter or digit) of at most maxDriverName characters.
func isDriverName(name string) bool {
	if name == "" || len(name) > maxDriverName {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
			if !alnum && (c != '-' || i == 0 || i == len(label)-1) {
				return false
			}
		}
	}
	return true
}

// oneDotX matches the versions ParseGeneric can read as 1.x: optional
// leading white space and "v", major 1 without leading zeros, a dot and
// a digit.
var oneDotX = regexp.MustCompile(`^[\t\n\f\r ]*v?1\.[0-9]`)

// FuzzValidatePlugin checks the registration handler's validation of a
// registrar's GetInfo answer (name, endpoint, versions, the latter split
// on commas) against a handler that already has a driver registered: it
// never panics; it never accepts a name that is not a CSI driver name (a
// DNS-1123 subdomain of at most 63 characters, letters in either case;
// so always a safe path element),
// an empty endpoint, or a version list without a 1.x; it accepts every
// valid answer for a new driver, and for the registered driver only a
// higher version; errors of a valid name name the driver.
func FuzzValidatePlugin(f *testing.F) {
	f.Add("csi.example.com", "/csi/csi.sock", "1.0.0")
	f.Add("csi.example.com", "/csi/csi.sock", "0.3.0,1.2.0,2.0.0")
	f.Add("CSI.Example.Com", "/csi/csi.sock", "v1.5.0")
	f.Add("registered.example.com", "/csi/r.sock", "1.2.0")
	f.Add("registered.example.com", "/csi/r.sock", "1.3.0")
	f.Add("registered.example.com", "/csi/r.sock", "1.2.0-beta,1.2")
	f.Add("csi.example.com", "", "1.0.0")
	f.Add("csi.example.com", "/csi/csi.sock", "")
	f.Add("csi.example.com", "/csi/csi.sock", "0.3.0,2.0.0,x,1,01.0, 1.0 ")
	f.Add("csi.example.com", "/csi/csi.sock", "1.99999999999999999999,1.0.99999999999999999999")
	f.Add("", "/csi/csi.sock", "1.0.0")
	f.Add("..", "/csi/csi.sock", "1.0.0")
	f.Add("a/b", "/csi/csi.sock", "1.0.0")
	f.Add("a..b", "/csi/csi.sock", "1.0.0")
	f.Add("-a.b", "/csi/csi.sock", "1.0.0")
	f.Add("a_b", "/csi/csi.sock", "1.0.0")
	f.Add("a^b", "/csi/csi.sock", "1.0.0")
	f.Add("\u212a.example.com", "/csi/csi.sock", "1.0.0") // Kelvin sign: strings.ToLower makes it "k"
	f.Add("d\x00", "/csi/csi.sock", "1.0.0")
	f.Add(strings.Repeat("a", 63), "/csi/csi.sock", "1.0.0")
	f.Add(strings.Repeat("a", 64), "/csi/csi.sock", "1.0.0")
	f.Add(strings.Repeat("\xff", 4096), strings.Repeat("/", 4096), strings.Repeat("1.", 2048))
	registered := version.MustParseGeneric("1.2.0")
	ctx := klog.NewContext(context.Background(), klog.Background().V(10)) // quiet
	reg := csi.NewRegistry(csi.RegistryOptions{})
	defer reg.Close()
	f.Fuzz(func(t *testing.T, name, endpoint, versionList string) {
		h, err := New(Config{Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		h.drivers["registered.example.com"] = &registration{endpoint: "/csi/r.sock", version: registered}
		var versions []string
		if versionList != "" {
			versions = strings.Split(versionList, ",")
		}
		err = h.ValidatePlugin(ctx, name, endpoint, versions)
		has1x := slices.ContainsFunc(versions, oneDotX.MatchString)
		if err == nil {
			if !isDriverName(name) {
				t.Fatalf("accepted driver name %q, not a DNS-1123 subdomain of at most %d characters", name, maxDriverName)
			}
			if err := fsutil.ValidateName("driver name", name); err != nil {
				t.Fatalf("accepted driver name %q: %v", name, err)
			}
			if endpoint == "" {
				t.Fatalf("accepted driver %q with an empty endpoint", name)
			}
			if !has1x {
				t.Fatalf("accepted driver %q with versions %q: no 1.x", name, versions)
			}
			if name == "registered.example.com" {
				v, verr := HighestSupportedVersion(versions)
				if verr != nil || !registered.LessThan(v) {
					t.Fatalf("accepted %q at versions %q (highest %v, %v), registered at %s", name, versions, v, verr, registered)
				}
			}
			return
		}
		if isDriverName(name) && !strings.Contains(err.Error(), name) {
			t.Fatalf("error %q does not name driver %q", err, name)
		}
		if isDriverName(name) && endpoint != "" && name != "registered.example.com" {
			// A valid new driver is refused only for want of a 1.x version.
			if _, verr := HighestSupportedVersion(versions); verr == nil {
				t.Fatalf("refused valid driver %q at %q with versions %q: %v", name, endpoint, versions, err)
			}
		}
	})
}

// FuzzHighestSupportedVersion checks that the version HighestSupportedVersion
// picks is a 1.x listed in the input, and not lower than any other 1.x
// listed; that it fails exactly when none is listed.
func FuzzHighestSupportedVersion(f *testing.F) {
	for _, s := range []string{"1.0.0", "0.3.0,1.2.0,2.0.0", "v1.5.0", "1.2.0-beta,1.2", "", "x", "1", "01.0", " 1.0 ",
		"1.99999999999999999999", "1.2.3.4.5", "1.10,1.9", "1.0.0+meta,1.0.0", "v1.0, 1.1\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		versions := strings.Split(list, ",")
		got, err := HighestSupportedVersion(versions)
		var ones []*version.Version
		for _, s := range versions {
			if v, perr := version.ParseGeneric(s); perr == nil && v.Major() == 1 {
				ones = append(ones, v)
			}
		}
		if err != nil {
			if len(ones) > 0 {
				t.Fatalf("HighestSupportedVersion(%q) failed (%v) though %v is 1.x", versions, err, ones[0])
			}
			return
		}
		if got.Major() != 1 || !slices.ContainsFunc(versions, oneDotX.MatchString) {
			t.Fatalf("HighestSupportedVersion(%q) = %v, not a listed 1.x", versions, got)
		}
		for _, v := range ones {
			if got.LessThan(v) {
				t.Fatalf("HighestSupportedVersion(%q) = %v, lower than listed %v", versions, got, v)
			}
		}
	})
}
