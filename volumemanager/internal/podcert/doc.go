// Package podcert issues the credentials of the podCertificate sources of
// projected volumes (GA in Kubernetes 1.37), as the kubelet's pod
// certificate manager (pkg/kubelet/podcertificate) does: for each source
// of each pod it generates a private key of the source's keyType, asks the
// source's signer for a certificate through a PodCertificateRequest, keeps
// the issued chain and the key in memory only, and renews them, with a new
// key and a new request, from the status's beginRefreshAt on. The
// projected volume plugin reads them (Manager.Credentials) and writes them
// into the pod's tmpfs; nothing here writes to disk.
//
// A request carries the signer, the pod (name, UID), its service account
// (name, and the UID read with a GET of the ServiceAccount, which the Node
// authorizer lets a node read for its pods), the node (name, and the UID
// read with a GET of the node's own Node), maxExpirationSeconds and the
// userAnnotations of the source (as unverifiedUserAnnotations), and
// stubPKCS10Request, an empty PKCS#10 request signed with the new key,
// whose signature the API server verifies at creation (certificates/v1 has
// no pkixPublicKey or proofOfPossession field). The request is owned by the pod (an owner
// reference), so the garbage collector deletes it with the pod, and the
// kube-controller-manager's PodCertificateRequest cleaner deletes every
// request 15 minutes after its creation: the node never deletes one (the
// Node authorizer does not let it).
//
// The Manager watches the requests of its node (a list and watch with the
// field selector spec.nodeName, the only one the Node authorizer allows a
// node) and moves each source through the kubelet's states: no request
// yet; a request pending; issued (the Issued condition: the chain, cleaned
// of headers and of text between blocks, and the pending key become the
// credential); renewing (issued, and a new request pending: the old
// credential is still handed out); denied or failed (the Denied or Failed
// condition: permanent for the pod, whose credential is no longer handed
// out, as the kubelet does). A pending request not seen for 10 minutes
// (plus up to 5 of jitter) after its creation is taken to have been
// deleted and is made again. OnChange tells the volume manager when a
// pod's credentials were issued, renewed, denied or failed, so that its
// projected volumes are written again at once rather than at a resync.
//
// Unlike the kubelet, the Manager is told about a source by the first
// Credentials call for it (the volume plugin's SetUp) rather than by
// reading the pod manager, and forgets a pod when told (Forget); it wakes
// at each source's refresh time and at the informer's events rather than
// at a one-minute pass over all pods; a request deleted while pending is
// made again at its watch's delete event rather than after the 10
// minutes; it sends the kubelet's Warning events (Denied, Failed,
// CertificateOverdueForRefresh, CertificateExpired) when given a
// recorder, and exports no metrics.
package podcert
