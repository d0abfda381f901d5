package volume

import "github.com/nodevol/nodevol/podvol"

// Method names a method of the plugin contract the volume manager calls,
// for messages about a call still running.
type Method string

// The methods of the contract that run as operations.
const (
	MethodWaitForAttach Method = "WaitForAttach" // Attacher
	MethodAttach        Method = "Attach"        // SelfAttacher
	MethodDetach        Method = "Detach"        // SelfAttacher
	MethodMountDevice   Method = "MountDevice"   // DeviceMounter
	MethodUnmountDevice Method = "UnmountDevice" // DeviceMounter
	MethodSetUp         Method = "SetUp"         // Mounter
	MethodTearDown      Method = "TearDown"      // Mounter
	MethodNodeExpand    Method = "NodeExpand"    // Expander
)

// CallNamer is implemented by a plugin whose methods make calls with
// names of their own, which a user reads better than the kubelet's
// operation words in a wait error that says what still runs: the CSI
// plugin names its RPCs ("NodePublishVolume still running after 3s").
// A plugin without it is described in the kubelet's words
// ("MountVolume.SetUp still running after 3s").
type CallNamer interface {
	// CallName returns the name of the call method makes for the volume,
	// or "" when it makes none of its own (the kubelet's words are used).
	CallName(m Method, spec *podvol.VolumeSpec) string
}
