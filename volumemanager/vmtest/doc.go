// Package vmtest is the test kit for code built on a volumemanager:
//
//   - NewEnv starts a real VolumeManager for a unit test in one call: a fake
//     clientset holding the Node and the driver's CSIDriver, the in-process
//     CSI driver of csiplugin/csitest on a unix socket and registered, the
//     fake attacher playing the attach/detach controller and the
//     external-attacher (it creates and attaches the VolumeAttachments of
//     attach-required volumes), a temporary root directory and the fake
//     mounter, which records what its bind mounts bind so that the
//     manager's subPath bind mounts (SubPaths().Prepare) work on it;
//     everything stops when the test ends.
//   - Fake implements volumemanager.Interface without doing anything, as
//     the kubelet's FakeVolumeManager does: it records the calls and
//     returns what the test sets, for tests of a kubelet fork's code that
//     uses a volume manager.
//
// It is a package of its own, not part of csiplugin/csitest, because
// volumemanager's own tests import csitest: csitest importing
// volumemanager would be an import cycle.
package vmtest
