package dynamicmig

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// Bind hands a GPU pod to its node: it takes the node's hand-off Lease for the pod
// (waiting while another pod of the node is being realised), then creates the Binding with
// the reservation as the Binding's annotations, which the API server merges into the pod
// together with the node. Two writes; never a bound pod without its reservation. Pods
// without GPU requests are left to DefaultBinder.
func (pl *DynamicMIG) Bind(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	r, ok := pl.reservations.get(pod.UID)
	if !ok {
		if _, err := readState(state); err != nil {
			return fwk.NewStatus(fwk.Skip) // PreFilter skipped it: no GPU request
		}
		return fwk.AsStatus(fmt.Errorf("pod %s/%s has no reservation to bind", pod.Namespace, pod.Name))
	}
	if r.node != nodeName {
		return fwk.AsStatus(fmt.Errorf("pod %s/%s was reserved on node %s, not %s", pod.Namespace, pod.Name, r.node, nodeName))
	}
	logger := klog.FromContext(ctx)
	key, err := pl.signingKeyFor(ctx)
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("cannot sign the reservation of pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	annotations, err := bindingAnnotations(pod, nodeName, r.result, key)
	if err != nil {
		return fwk.AsStatus(err)
	}
	holder := holderIdentity(pod)
	waitStart := time.Now()
	// One bind per node at a time contends for the node's Lease: the others queue here, in
	// the process, instead of racing for it with API writes that would conflict. Each bind
	// bounds its own wait for the Lease, so the queue always moves; its wait is not bounded
	// here, since it includes the client's rate limiting of the binds ahead of it.
	release, err := pl.nodeGates.acquire(ctx, nodeName)
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("stopped waiting for other pods' hand-offs on node %s: %w", nodeName, err))
	}
	defer release()
	if err := pl.takeHandoff(ctx, pod, nodeName, holder, time.Now().Add(pl.args.HandoffTimeout.Duration)); err != nil {
		return fwk.AsStatus(err)
	}
	observeHandoffWait(waitStart)
	start := time.Now()
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: annotations},
		Target:     v1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	if err := pl.client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		pl.releaseHandoff(ctx, nodeName, holder)
		return fwk.AsStatus(fmt.Errorf("binding pod %s/%s to %s: %w", pod.Namespace, pod.Name, nodeName, err))
	}
	observeLatency("bind", start)
	logger.V(2).Info("Bound GPU pod", "pod", klog.KObj(pod), "node", nodeName, "devices", describe(r.result))
	pl.recordBindEvents(pod, r.result)
	return nil
}

// bindingAnnotations are what the Binding carries: the reservation in its pool's format,
// signed for this pod and node, the node, the bind time and phase.
func bindingAnnotations(pod *v1.Pod, nodeName string, res *placement.Result, key ed25519.PrivateKey) (map[string]string, error) {
	a := map[string]string{
		api.AssignedNodeAnnotation: nodeName,
		api.BindTimeAnnotation:     strconv.FormatInt(time.Now().Unix(), 10),
		api.BindPhaseAnnotation:    api.BindPhaseAllocating,
	}
	if res.Mode == api.ModeMIG {
		raw, err := api.EncodeMigReservations(res.MigReservations())
		if err != nil {
			return nil, fmt.Errorf("encoding the reservation of %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		a[api.MigReservationsAnnotation] = raw
	} else {
		containers := make([][]api.HAMiCoreDevice, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
		for _, as := range res.Assignments {
			if as.ContainerIndex < len(containers) {
				containers[as.ContainerIndex] = append(containers[as.ContainerIndex], api.HAMiCoreDevice{UUID: as.GPUUUID, Type: "NVIDIA", MemoryMiB: as.MemoryMiB, Cores: as.Cores})
			}
		}
		raw := api.EncodeHAMiCoreDevices(containers)
		a[api.DevicesAllocatedAnnotation] = raw
		a[api.DevicesToAllocateAnnotation] = raw
	}
	if err := api.SignReservation(key, string(pod.UID), nodeName, a); err != nil {
		return nil, fmt.Errorf("signing the reservation of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return a, nil
}

// holderIdentity names the pod in the hand-off Lease.
func holderIdentity(pod *v1.Pod) string {
	return api.HandoffHolder(pod.Namespace, pod.Name, string(pod.UID))
}

// takeHandoff takes the node's hand-off Lease for the pod. It waits, never fails fast,
// while another pod holds it, and takes it over only when that pod is gone, terminal,
// fully realised, or still unbound after the Lease expired (a scheduler died between
// Lease and Binding). The Lease and its holder are read from the informers, so a hand-off
// costs one write and no read; a stale cache only costs a refused write and another look.
func (pl *DynamicMIG) takeHandoff(ctx context.Context, pod *v1.Pod, nodeName, holder string, deadline time.Time) error {
	leases := pl.client.CoordinationV1().Leases(pl.args.LeaseNamespace)
	name := api.HandoffLeaseName(nodeName)
	wait := 20 * time.Millisecond
	for {
		changed := pl.leaseChanges.next()
		cached, err := pl.handoffLease(name)
		now := metav1.NewMicroTime(time.Now())
		var written *coordinationv1.Lease
		switch {
		case apierrors.IsNotFound(err):
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pl.args.LeaseNamespace}}
			pl.fillHandoff(lease, holder, now)
			written, err = leases.Create(ctx, lease, metav1.CreateOptions{})
		case err != nil:
		default:
			current := ptr.Deref(cached.Spec.HolderIdentity, "")
			var why string
			if current != "" && current != holder {
				why = pl.holderBlocks(ctx, cached, current)
			}
			if why == "" {
				lease := cached.DeepCopy()
				pl.fillHandoff(lease, holder, now)
				written, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
			} else {
				err = fmt.Errorf("%s", why)
			}
		}
		switch {
		case err == nil:
			pl.writtenLeases.Store(name, written)
			return nil
		case apierrors.IsNotFound(err):
			pl.writtenLeases.Delete(name) // deleted behind our back: the informer will say
		}
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			klog.FromContext(ctx).V(4).Info("Waiting for the hand-off Lease", "pod", klog.KObj(pod), "lease", name, "reason", err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("timed out after %s waiting for hand-off Lease %s/%s: %v", pl.args.HandoffTimeout.Duration, pl.args.LeaseNamespace, name, err)
		}
		// Any Lease event may be the release: look again then, or after a backoff that
		// covers a missed event (a holder that ends without touching the Lease).
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped waiting for hand-off Lease %s/%s: %v", pl.args.LeaseNamespace, name, err)
		case <-changed:
		case <-time.After(min(wait, left)):
			wait = min(2*wait, time.Second)
		}
	}
}

// handoffLease is the freshest copy of the node's hand-off Lease this scheduler knows: the
// informer's, or the one it wrote itself last when the informer has not caught up with
// that write yet (which would otherwise cost the next bind on the node a refused write).
func (pl *DynamicMIG) handoffLease(name string) (*coordinationv1.Lease, error) {
	cached, err := pl.leases.Get(name)
	w, ok := pl.writtenLeases.Load(name)
	if !ok {
		return cached, err
	}
	written := w.(*coordinationv1.Lease)
	if apierrors.IsNotFound(err) || (err == nil && newerVersion(written, cached)) {
		return written, nil
	}
	return cached, err
}

// newerVersion reports whether a is a later version of the object than b. Resource versions
// are etcd revisions; they are compared as numbers, as kube-scheduler's assume cache does,
// and a version that is not a number is never newer.
func newerVersion(a, b metav1.Object) bool {
	va, errA := strconv.ParseInt(a.GetResourceVersion(), 10, 64)
	vb, errB := strconv.ParseInt(b.GetResourceVersion(), 10, 64)
	return errA == nil && errB == nil && va > vb
}

func (pl *DynamicMIG) fillHandoff(lease *coordinationv1.Lease, holder string, now metav1.MicroTime) {
	lease.Spec.HolderIdentity = ptr.To(holder)
	lease.Spec.LeaseDurationSeconds = ptr.To(pl.args.HandoffLeaseDurationSeconds)
	lease.Spec.AcquireTime = &now
	lease.Spec.RenewTime = &now
}

// holderBlocks says why the current holder keeps the Lease, or "" when it may be taken over.
// The pod informer decides when it shows the holder's pod bound (a realised, failed,
// ending or terminal pod never goes back); a pod it does not show, shows under another
// UID, or shows unbound after the Lease expired, is read from the API server, since the
// informer may lag.
func (pl *DynamicMIG) holderBlocks(ctx context.Context, lease *coordinationv1.Lease, holder string) string {
	ns, name, uid, ok := api.ParseHandoffHolder(holder)
	if !ok {
		return "" // not a holder this project writes: take it
	}
	if p, err := pl.pods.Pods(ns).Get(name); err == nil && string(p.UID) == uid {
		if holderKeeps(p, uid, lease) {
			return blockedBy(p)
		}
		if p.Spec.NodeName != "" {
			return "" // realised, failed or ending: for good
		}
		// Unbound after its Lease expired: confirm, the informer may not show the Binding yet.
	}
	p, err := pl.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return ""
	case err != nil:
		return fmt.Sprintf("cannot read hand-off holder %s: %v", holder, err)
	case holderKeeps(p, uid, lease):
		return blockedBy(p)
	}
	return ""
}

// holderKeeps reports whether the pod (of the holder's uid) still holds the hand-off: it
// exists, is not ending, is not realised or failed, and is bound or its Lease is fresh.
func holderKeeps(p *v1.Pod, uid string, lease *coordinationv1.Lease) bool {
	switch {
	case string(p.UID) != uid, p.Status.Phase == v1.PodSucceeded, p.Status.Phase == v1.PodFailed, p.DeletionTimestamp != nil:
		return false
	case p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseSuccess || p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseFailed:
		return false
	case p.Spec.NodeName == "" && !leaseFresh(lease, time.Now()):
		return false
	}
	return true
}

func blockedBy(p *v1.Pod) string {
	return fmt.Sprintf("pod %s/%s holds it and is being realised (bind-phase %q)", p.Namespace, p.Name, p.Annotations[api.BindPhaseAnnotation])
}

// handoffBusy reports whether a GPU pod is being handed off on the node: one reserved by
// this scheduler and not yet seen bound, or a fresh hand-off Lease with a holder.
func (pl *DynamicMIG) handoffBusy(node string) bool {
	return pl.reservations.reservedOn(node) > 0 || pl.leaseTimes.handoffHeld(node, time.Now())
}

// releaseHandoff clears the Lease's holder after a failed Binding, if it is still ours.
func (pl *DynamicMIG) releaseHandoff(ctx context.Context, nodeName, holder string) {
	leases := pl.client.CoordinationV1().Leases(pl.args.LeaseNamespace)
	lease, err := leases.Get(ctx, api.HandoffLeaseName(nodeName), metav1.GetOptions{})
	if err != nil || ptr.Deref(lease.Spec.HolderIdentity, "") != holder {
		return
	}
	lease.Spec.HolderIdentity = nil
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		klog.FromContext(ctx).Error(err, "Releasing the hand-off Lease after a failed Binding", "lease", klog.KObj(lease))
	}
}

// recordBindEvents says on the pod what it got.
func (pl *DynamicMIG) recordBindEvents(pod *v1.Pod, res *placement.Result) {
	rec := pl.handle.EventRecorder()
	if rec == nil {
		return
	}
	rec.Eventf(pod, nil, v1.EventTypeNormal, "Reserved", "Binding", "Reserved %s", describe(res))
	if res.Mode != api.ModeMIG {
		return
	}
	perContainer := map[int]int{}
	for _, a := range res.Assignments {
		perContainer[a.ContainerIndex]++
	}
	for idx, n := range perContainer {
		if n > 1 {
			rec.Eventf(pod, nil, v1.EventTypeWarning, "MultipleMIGDevices", "Binding",
				"container %s gets %d MIG devices, but CUDA uses one MIG device per process; run one process per device", containerName(pod, idx), n)
		}
	}
}

func containerName(pod *v1.Pod, idx int) string {
	if idx < len(pod.Spec.InitContainers) {
		return strconv.Quote(pod.Spec.InitContainers[idx].Name)
	}
	if idx -= len(pod.Spec.InitContainers); idx < len(pod.Spec.Containers) {
		return strconv.Quote(pod.Spec.Containers[idx].Name)
	}
	return strconv.Itoa(idx)
}

// describe summarises a fit: "2g.10gb on GPU-… placement [0,2), …".
func describe(res *placement.Result) string {
	parts := make([]string, len(res.Assignments))
	for i, a := range res.Assignments {
		if a.Mode == api.ModeMIG {
			parts[i] = fmt.Sprintf("%s on %s placement %s", a.Profile, a.GPUUUID, a.Placement)
		} else {
			parts[i] = fmt.Sprintf("%d MiB and %d%% cores of %s", a.MemoryMiB, a.Cores, a.GPUUUID)
		}
	}
	return strings.Join(parts, ", ")
}

// nodeGates lets one bind at a time per node take the node's hand-off Lease.
type nodeGates struct {
	mu    sync.Mutex
	gates map[string]chan struct{}
}

func (g *nodeGates) acquire(ctx context.Context, node string) (release func(), err error) {
	g.mu.Lock()
	if g.gates == nil {
		g.gates = map[string]chan struct{}{}
	}
	gate, ok := g.gates[node]
	if !ok {
		gate = make(chan struct{}, 1)
		g.gates[node] = gate
	}
	g.mu.Unlock()
	select {
	case gate <- struct{}{}:
		return func() { <-gate }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// broadcast wakes every waiter once per event: next returns a channel that is closed at
// the next call of notify.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func (b *broadcast) next() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}
