// Package allocate realises the scheduler's MIG reservations when kubelet calls Allocate:
// it works out whose call it is through the node's hand-off Lease, checks the reservation,
// creates each GI and CI at exactly the reserved placement (recording intent and result in
// the checkpoint), writes the runtime identity back to the pod, and releases the Lease after
// the pod's last GPU container. It also reclaims the instances of pods that ended.
package allocate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/instances"
	"github.com/dynamig/dynamig/deviceplugin/metrics"
	"github.com/dynamig/dynamig/signing"
)

// Options configure an Allocator.
type Options struct {
	NodeName       string
	Client         kubernetes.Interface
	Names          config.ResourceNames
	LeaseNamespace string
	Instances      *instances.Manager
	Checkpoint     *checkpoint.Checkpoint
	// Verifier checks each reservation's signature before anything is created.
	Verifier *signing.Verifier
	// PreemptionWait bounds how long Allocate waits for an instance of a pod being deleted
	// to go from the reserved placement (default 60 s).
	PreemptionWait time.Duration
	// Poll is how often it looks again while waiting (default 500 ms).
	Poll time.Duration
	// HAMiCore configures shared (hami-core) GPUs.
	HAMiCore HAMiCoreOptions
}

// Allocator serves kubelet's Allocate calls for MIG GPUs.
type Allocator struct {
	opts Options
}

// New checks the options.
func New(opts Options) (*Allocator, error) {
	switch {
	case opts.NodeName == "":
		return nil, errors.New("allocate: NodeName is required")
	case opts.Client == nil || opts.Instances == nil || opts.Checkpoint == nil || opts.Verifier == nil:
		return nil, errors.New("allocate: Client, Instances, Checkpoint and Verifier are required")
	}
	if opts.LeaseNamespace == "" {
		opts.LeaseNamespace = api.DefaultSystemNamespace
	}
	if opts.Names.ResourceCountName == "" {
		opts.Names = config.DefaultResourceNames()
	}
	if opts.PreemptionWait == 0 {
		opts.PreemptionWait = 60 * time.Second
	}
	if opts.Poll == 0 {
		opts.Poll = 500 * time.Millisecond
	}
	return &Allocator{opts: opts}, nil
}

// Failure reasons of Allocate, the label of its error metric.
const (
	reasonAttribution = "attribution" // whose call it is cannot be told
	reasonTampered    = "tampered"
	reasonCreate      = "create"
	reasonWriteBack   = "write_back"
)

// reasonError carries a metric reason with an error.
type reasonError struct {
	reason string
	err    error
}

func (e *reasonError) Error() string { return e.err.Error() }
func (e *reasonError) Unwrap() error { return e.err }

func because(reason string, err error) error { return &reasonError{reason: reason, err: err} }

// Allocate realises the reservations of the hand-off holder's next GPU container.
func (a *Allocator) Allocate(ctx context.Context, req *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error) {
	start := time.Now()
	resp, err := a.allocate(ctx, req)
	reason := ""
	if err != nil {
		reason = "other"
		var re *reasonError
		if errors.As(err, &re) {
			reason = re.reason
		}
	}
	metrics.ObserveAllocate(start, reason)
	return resp, err
}

func (a *Allocator) allocate(ctx context.Context, req *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error) {
	lease, holder, err := a.holder(ctx)
	if err != nil {
		return nil, because(reasonAttribution, err)
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(holder))
	ctx = klog.NewContext(ctx, logger)
	if err := a.checkUnambiguous(ctx, holder); err != nil {
		return nil, because(reasonAttribution, err)
	}
	// Nothing is created for a reservation the scheduler did not sign for this pod and node.
	if err := a.opts.Verifier.Verify(holder); err != nil {
		a.failed(ctx, holder, err)
		return nil, because(reasonTampered, err)
	}
	raw, ok := holder.Annotations[api.MigReservationsAnnotation]
	if !ok {
		if _, core := holder.Annotations[api.DevicesToAllocateAnnotation]; core {
			return a.allocateHAMiCore(ctx, lease, holder, req)
		}
		return nil, fmt.Errorf("pod %s/%s holds the hand-off Lease but carries neither %s nor %s: nothing to allocate", holder.Namespace, holder.Name, api.MigReservationsAnnotation, api.DevicesToAllocateAnnotation)
	}
	recs, err := api.DecodeMigReservations(raw)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", holder.Namespace, holder.Name, err)
	}
	gpuContainers := a.gpuContainers(holder)
	idx, last := nextContainer(gpuContainers, recs)
	if idx < 0 {
		return nil, because(reasonAttribution, fmt.Errorf("pod %s/%s: every GPU container is already realised; this Allocate call belongs to no container of the hand-off holder", holder.Namespace, holder.Name))
	}
	mine := containerReservations(recs, idx)
	if len(mine) != len(req.DevicesIds) {
		return nil, because(reasonAttribution, fmt.Errorf("pod %s/%s container %d has %d MIG reservations but kubelet asks for %d devices: refusing an Allocate that cannot be attributed", holder.Namespace, holder.Name, idx, len(mine), len(req.DevicesIds)))
	}
	made, err := a.realise(ctx, holder, mine)
	if err != nil {
		a.failed(ctx, holder, err)
		return nil, because(reasonCreate, err)
	}
	for _, in := range made {
		for i := range recs {
			if recs[i].ContainerIndex == idx && recs[i].DeviceIndex == in.deviceIndex {
				recs[i].SetRuntime(in.MigUUID, uint32(in.GPUInstanceID), uint32(in.ComputeInstanceID))
			}
		}
	}
	if err := a.writeBack(ctx, holder, recs, last); err != nil {
		return nil, because(reasonWriteBack, err)
	}
	if last {
		a.releaseLease(ctx, lease)
	}
	uuids := make([]string, len(made))
	for i, in := range made {
		uuids[i] = in.MigUUID
	}
	logger.V(2).Info("Allocated MIG devices", "containerIndex", idx, "migUUIDs", uuids)
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(uuids, ",")}}, nil
}

// holder reads the hand-off Lease and the pod it names.
func (a *Allocator) holder(ctx context.Context) (*coordinationv1.Lease, *v1.Pod, error) {
	name := api.HandoffLeaseName(a.opts.NodeName)
	lease, err := a.opts.Client.CoordinationV1().Leases(a.opts.LeaseNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("no hand-off Lease %s/%s to attribute this Allocate to (was the pod scheduled by dynamig-scheduler?): %w", a.opts.LeaseNamespace, name, err)
	}
	h := ""
	if lease.Spec.HolderIdentity != nil {
		h = *lease.Spec.HolderIdentity
	}
	ns, podName, uid, ok := api.ParseHandoffHolder(h)
	if !ok {
		return nil, nil, fmt.Errorf("the hand-off Lease %s/%s is held by no pod (holder %q): this Allocate belongs to no reservation dynamig-scheduler made", a.opts.LeaseNamespace, name, h)
	}
	pod, err := a.opts.Client.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("reading hand-off holder %s: %w", h, err)
	case string(pod.UID) != uid:
		return nil, nil, fmt.Errorf("hand-off holder %s no longer exists (pod %s/%s has UID %s)", h, ns, podName, pod.UID)
	case pod.Spec.NodeName != a.opts.NodeName:
		return nil, nil, fmt.Errorf("hand-off holder %s is bound to %q, not this node %s", h, pod.Spec.NodeName, a.opts.NodeName)
	}
	return lease, pod, nil
}

// checkUnambiguous refuses when another GPU pod bound here is neither realised nor ended:
// then the call could be that pod's.
func (a *Allocator) checkUnambiguous(ctx context.Context, holder *v1.Pod) error {
	list, err := a.opts.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + a.opts.NodeName})
	if err != nil {
		return fmt.Errorf("listing this node's pods to attribute the Allocate: %w", err)
	}
	for i := range list.Items {
		p := &list.Items[i]
		if p.UID == holder.UID || p.Spec.NodeName != a.opts.NodeName || !hasReservation(p) || ended(p) {
			continue
		}
		if p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseAllocating {
			return fmt.Errorf("cannot tell whose Allocate this is: pod %s/%s holds the hand-off Lease but pod %s/%s on this node is still being allocated", holder.Namespace, holder.Name, p.Namespace, p.Name)
		}
	}
	return nil
}

func hasReservation(p *v1.Pod) bool {
	_, mig := p.Annotations[api.MigReservationsAnnotation]
	_, core := p.Annotations[api.DevicesAllocatedAnnotation]
	return mig || core
}

func ended(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

// gpuContainers lists, in containerIndex order, the containers asking for the count resource.
func (a *Allocator) gpuContainers(p *v1.Pod) []int {
	var out []int
	all := append(append([]v1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
	for i, c := range all {
		q, ok := c.Resources.Limits[v1.ResourceName(a.opts.Names.ResourceCountName)]
		if !ok {
			q, ok = c.Resources.Requests[v1.ResourceName(a.opts.Names.ResourceCountName)]
		}
		if ok && q.Value() > 0 {
			out = append(out, i)
		}
	}
	return out
}

// nextContainer is the first GPU container whose reservations are not all realised, and
// whether it is the last one.
func nextContainer(gpuContainers []int, recs []api.MigReservation) (idx int, last bool) {
	for k, c := range gpuContainers {
		done := true
		for _, r := range recs {
			if r.ContainerIndex == c && !r.Realized() {
				done = false
			}
		}
		if !done {
			return c, k == len(gpuContainers)-1
		}
	}
	return -1, false
}

func containerReservations(recs []api.MigReservation, idx int) []api.MigReservation {
	var out []api.MigReservation
	for _, r := range recs {
		if r.ContainerIndex == idx {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b api.MigReservation) int { return a.DeviceIndex - b.DeviceIndex })
	return out
}

// made is an instance realised for one device of the container.
type made struct {
	instances.Instance
	containerIndex, deviceIndex int
	created                     bool // by this call, so a failure rolls it back
}

// realise creates (or finds, for a repeated call) the container's instances; on a failure
// it destroys those this call created.
func (a *Allocator) realise(ctx context.Context, pod *v1.Pod, recs []api.MigReservation) ([]made, error) {
	var out []made
	for _, r := range recs {
		m, err := a.realiseOne(ctx, pod, r)
		if err != nil {
			for _, done := range out {
				if done.created {
					a.undo(ctx, pod, done)
				}
			}
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

func (a *Allocator) realiseOne(ctx context.Context, pod *v1.Pod, r api.MigReservation) (made, error) {
	key := checkpoint.Key{PodUID: string(pod.UID), ContainerIndex: r.ContainerIndex, DeviceIndex: r.DeviceIndex}
	if _, err := a.opts.Instances.ProfileID(r.GPUUUID, r.Profile, r.Placement); err != nil {
		return made{}, fmt.Errorf("pod %s/%s container %d device %d: %w", pod.Namespace, pod.Name, r.ContainerIndex, r.DeviceIndex, err)
	}
	unlock, err := a.opts.Instances.Lock(r.GPUUUID)
	if err != nil {
		return made{}, err
	}
	defer unlock()
	// Idempotent: an instance this plugin already made for this pod, container and device.
	if e, ok := a.opts.Checkpoint.Get(key); ok {
		if e.State == checkpoint.Created {
			if in, found := a.find(r.GPUUUID, e); found {
				return made{Instance: in, containerIndex: r.ContainerIndex, deviceIndex: r.DeviceIndex}, nil
			}
		} else if err := a.finishIntent(ctx, e); err != nil {
			return made{}, err
		}
	}
	if err := a.clearPlacement(ctx, pod, r); err != nil {
		return made{}, err
	}
	entry := checkpoint.Entry{Key: key, PodNamespace: pod.Namespace, PodName: pod.Name, GPUUUID: r.GPUUUID, Profile: r.Profile, Placement: r.Placement, State: checkpoint.Intent}
	if err := a.opts.Checkpoint.Put(entry); err != nil {
		return made{}, fmt.Errorf("recording the intent before creating: %w", err)
	}
	in, err := a.opts.Instances.Create(ctx, r.GPUUUID, r.Profile, r.Placement)
	if err != nil {
		_ = a.opts.Checkpoint.Remove(key) // nothing was left behind: Create rolled back
		return made{}, fmt.Errorf("pod %s/%s container %d device %d: %w", pod.Namespace, pod.Name, r.ContainerIndex, r.DeviceIndex, err)
	}
	entry.State, entry.GPUInstanceID, entry.ComputeInstanceID, entry.MigUUID = checkpoint.Created, in.GPUInstanceID, in.ComputeInstanceID, in.MigUUID
	if err := a.opts.Checkpoint.Put(entry); err != nil {
		_ = a.opts.Instances.Destroy(ctx, r.GPUUUID, in.GPUInstanceID)
		_ = a.opts.Checkpoint.Remove(key)
		return made{}, fmt.Errorf("recording the created instance: %w", err)
	}
	return made{Instance: in, containerIndex: r.ContainerIndex, deviceIndex: r.DeviceIndex, created: true}, nil
}

// finishIntent clears what a create interrupted (a crash between intent and result) left
// at the intent's placement, so the create can start afresh, and forgets the intent.
func (a *Allocator) finishIntent(ctx context.Context, e checkpoint.Entry) error {
	if err := a.destroyAt(ctx, e); err != nil {
		return fmt.Errorf("clearing an interrupted create at %s on %s: %w", e.Placement, e.GPUUUID, err)
	}
	return a.opts.Checkpoint.Remove(e.Key)
}

// find looks the checkpoint's instance up in NVML by its complete identity.
func (a *Allocator) find(gpu string, e checkpoint.Entry) (instances.Instance, bool) {
	list, err := a.opts.Instances.List(gpu)
	if err != nil {
		return instances.Instance{}, false
	}
	for _, in := range list {
		if in.Complete && in.GPUInstanceID == e.GPUInstanceID && in.ComputeInstanceID == e.ComputeInstanceID &&
			in.MigUUID == e.MigUUID && in.Placement == e.Placement && in.Profile == e.Profile {
			return in, true
		}
	}
	return instances.Instance{}, false
}

// clearPlacement makes sure nothing occupies the reserved placement: instances of ended
// pods are reclaimed, and an instance of a pod being deleted (a preemption victim) is
// waited for, bounded. The GPU lock is held.
func (a *Allocator) clearPlacement(ctx context.Context, pod *v1.Pod, r api.MigReservation) error {
	deadline := time.Now().Add(a.opts.PreemptionWait)
	for {
		if err := a.reclaimLocked(ctx, r.GPUUUID); err != nil {
			klog.FromContext(ctx).Info("Reclaim before create skipped", "gpu", r.GPUUUID, "err", err)
		}
		blocker, err := a.blocker(ctx, r)
		if err != nil || blocker == "" {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s/%s container %d device %d: placement %s of %s is still held by %s after %s", pod.Namespace, pod.Name, r.ContainerIndex, r.DeviceIndex, r.Placement, r.GPUUUID, blocker, a.opts.PreemptionWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(a.opts.Poll):
		}
	}
}

// blocker names what holds an overlapping instance that may go (a pod being deleted), or
// returns an error for one that will not.
func (a *Allocator) blocker(ctx context.Context, r api.MigReservation) (string, error) {
	list, err := a.opts.Instances.List(r.GPUUUID)
	if err != nil {
		return "", err
	}
	for _, in := range list {
		if !in.Placement.Overlaps(r.Placement) {
			continue
		}
		owner, ok := a.owner(in)
		if !ok {
			return "", fmt.Errorf("placement %s of %s overlaps GPU instance %d at %s, which dynamig did not create; refusing", r.Placement, r.GPUUUID, in.GPUInstanceID, in.Placement)
		}
		p, err := a.opts.Client.CoreV1().Pods(owner.PodNamespace).Get(ctx, owner.PodName, metav1.GetOptions{})
		switch {
		case err == nil && string(p.UID) == owner.PodUID && p.DeletionTimestamp == nil && !ended(p):
			return "", fmt.Errorf("placement %s of %s overlaps the instance of running pod %s/%s: the reservation would double-book it", r.Placement, r.GPUUUID, p.Namespace, p.Name)
		case err != nil && !apierrors.IsNotFound(err):
			return "", err
		}
		return fmt.Sprintf("the instance of pod %s/%s, which is going away", owner.PodNamespace, owner.PodName), nil
	}
	return "", nil
}

// owner finds the checkpoint entry of an instance.
func (a *Allocator) owner(in instances.Instance) (checkpoint.Entry, bool) {
	for _, e := range a.opts.Checkpoint.Entries() {
		if e.GPUUUID == in.GPUUUID && e.Placement == in.Placement && (e.State == checkpoint.Intent || e.GPUInstanceID == in.GPUInstanceID) {
			return e, true
		}
	}
	return checkpoint.Entry{}, false
}

// undo destroys an instance this call created and forgets it.
func (a *Allocator) undo(ctx context.Context, pod *v1.Pod, m made) {
	unlock, err := a.opts.Instances.Lock(m.GPUUUID)
	if err != nil {
		return
	}
	defer unlock()
	if err := a.opts.Instances.Destroy(ctx, m.GPUUUID, m.GPUInstanceID); err != nil {
		klog.FromContext(ctx).Error(err, "Rolling back an instance", "gpu", m.GPUUUID, "gpuInstanceID", m.GPUInstanceID)
		return
	}
	_ = a.opts.Checkpoint.Remove(checkpoint.Key{PodUID: string(pod.UID), ContainerIndex: m.containerIndex, DeviceIndex: m.deviceIndex})
}
