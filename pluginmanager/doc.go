// Package pluginmanager does what the kubelet's plugin manager does for
// plugins that announce themselves through the plugin registration
// directory ({root}/plugins_registry): a plugin's registrar (for CSI
// drivers, node-driver-registrar) creates a unix socket there serving the
// k8s.io/kubelet/pkg/apis/pluginregistration/v1 Registration service; the
// manager notices it, asks it who it is (GetInfo), hands the answer to the
// Handler registered for the plugin's type, and tells the registrar the
// result (NotifyRegistrationStatus). When the socket goes, the plugin is
// deregistered.
//
// The manager keeps two sets keyed by socket path: the desired set (the
// sockets that exist, each with a generation that changes whenever the
// socket is created again) and the actual set (the plugins registered, with
// the generation they were registered from). One loop owns both. fsnotify
// events, the results of registrations and retry timers drive it; a
// periodic rescan of the directory is only a safety net for lost events.
// For each socket the loop decides (see plan) whether to register,
// deregister, wait for a retry or do nothing; the registrations and
// deregistrations run in their own goroutines, at most one per socket at a
// time, and return their outcome to the loop, which is the only writer of
// the actual set.
//
// Behaviour worth knowing:
//
//   - Sockets present when Run starts are registered (a node agent restart).
//   - Subdirectories are watched too. Names starting with "." and anything
//     that is not a unix socket (checked with lstat, so symlinks are
//     ignored) are ignored.
//   - A socket created again (a registrar restart) is deregistered and then
//     registered again.
//   - A failed registration (no answer, not gRPC, an unknown plugin type, a
//     refusal by the handler, a handler error) is reported to the registrar
//     when it can be reached, logged with the socket path and the reason,
//     and retried with exponential backoff until it succeeds or the socket
//     goes. (The kubelet does not retry in one case, kubernetes#118317.)
//   - A socket removed while its registration runs: the registration is
//     cancelled, and if it had already succeeded the plugin is deregistered.
//   - A failed deregistration is retried with backoff while the socket
//     stays away.
//   - When Run returns, registered plugins stay registered: like the
//     kubelet, the manager does not deregister on shutdown.
package pluginmanager
