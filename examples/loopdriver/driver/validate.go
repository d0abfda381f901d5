package driver

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodevol/nodevol/internal/fsutil"
)

// invalid returns an InvalidArgument status error.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// validateID checks a volume ID from a request: it must be present and
// be a single safe path element, since it names the volume's files.
func validateID(id string) error {
	if id == "" {
		return invalid("volume_id is required")
	}
	if err := fsutil.ValidateName("volume_id", id); err != nil {
		return invalid("%v", err)
	}
	return nil
}

// validateName checks CreateVolume's name. The volume ID is derived from
// it by hashing, but a name that could not be a path element is refused
// anyway: COs may use names as paths of their own.
func validateName(name string) error {
	if name == "" {
		return invalid("name is required")
	}
	if err := fsutil.ValidateName("name", name); err != nil {
		return invalid("%v", err)
	}
	return nil
}

// validatePath checks a staging or target path: present, absolute and
// clean (no "..", no "//"), and not inside the driver's state directory,
// so that no request can make the driver mount over its own files.
func (d *server) validatePath(field, p string) error {
	switch {
	case p == "":
		return invalid("%s is required", field)
	case strings.IndexByte(p, 0) >= 0:
		return invalid("%s must not contain a NUL byte", field)
	case !filepath.IsAbs(p):
		return invalid("%s %q must be an absolute path", field, p)
	case filepath.Clean(p) != p:
		return invalid("%s %q must be a clean path (no \"..\", \".\" or repeated \"/\")", field, p)
	case p == "/":
		return invalid("%s must not be /", field)
	}
	if rel, err := filepath.Rel(d.stateDir, p); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return invalid("%s %q is inside the driver's state directory", field, p)
	}
	return nil
}

// supportedFsTypes are the file systems NodeStageVolume can make.
var supportedFsTypes = []string{"ext4", "ext3", "ext2", "xfs"}

// defaultFsType is used when a mount capability names none.
const defaultFsType = "ext4"

// accessKind says how a volume capability accesses the volume.
type accessKind int

const (
	accessMount accessKind = iota + 1
	accessBlock
)

// checkCapability returns what cap asks for, or why the driver cannot do
// it: a missing access type, a multi-node access mode or an unknown file
// system. field names the request field in messages.
func checkCapability(field string, c *csi.VolumeCapability) (accessKind, error) {
	if c == nil {
		return 0, invalid("%s is required", field)
	}
	var kind accessKind
	switch {
	case c.GetBlock() != nil && c.GetMount() != nil:
		return 0, invalid("%s: both block and mount access types given", field)
	case c.GetBlock() != nil:
		kind = accessBlock
	case c.GetMount() != nil:
		kind = accessMount
		fs := c.GetMount().GetFsType()
		if fs != "" && !fsTypeSupported(fs) {
			return 0, invalid("%s: fs_type %q is not supported (supported: %s with its mkfs installed)", field, fs, strings.Join(supportedFsTypes, ", "))
		}
		if g := c.GetMount().GetVolumeMountGroup(); g != "" {
			return 0, invalid("%s: volume_mount_group is not supported", field)
		}
	default:
		return 0, invalid("%s: access_type (block or mount) is required", field)
	}
	if c.GetAccessMode() == nil {
		return 0, invalid("%s: access_mode is required", field)
	}
	switch m := c.GetAccessMode().GetMode(); m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
	default:
		return 0, invalid("%s: access mode %s is not supported: a loop device lives on one node", field, m)
	}
	return kind, nil
}

// checkCapabilities checks every capability in caps, which must not be
// empty.
func checkCapabilities(field string, caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return invalid("%s is required", field)
	}
	for i, c := range caps {
		if _, err := checkCapability(fmt.Sprintf("%s[%d]", field, i), c); err != nil {
			return err
		}
	}
	return nil
}

func fsTypeSupported(fs string) bool {
	for _, s := range supportedFsTypes {
		if s == fs {
			_, err := exec.LookPath("mkfs." + fs)
			return err == nil
		}
	}
	return false
}

// readOnlyMode reports whether the access mode only allows reading.
func readOnlyMode(c *csi.VolumeCapability) bool {
	m := c.GetAccessMode().GetMode()
	return m == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY ||
		m == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// checkParameters refuses CreateVolume parameters the driver does not
// know, except the csi.storage.k8s.io/ ones the external-provisioner
// adds (PVC name and namespace), which are informational.
func checkParameters(params map[string]string) error {
	for k := range params {
		if strings.HasPrefix(k, "csi.storage.k8s.io/") {
			continue
		}
		return invalid("parameters: unknown parameter %q (this driver takes none)", k)
	}
	return nil
}
