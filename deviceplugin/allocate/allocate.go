// Package allocate realises the scheduler's reservations through the kubelet's device
// hand-off. Allocate creates nothing: it answers each device ID with its CDI device name.
// PreStartContainer, which the kubelet calls before every start of a container holding
// those IDs, asks the kubelet's PodResources API which pod and container hold them, reads
// that pod's signed reservation, realises it (adopts the instance that exists, or creates
// the GI and CI at exactly the reserved placement, recording intent and result in the
// checkpoint), writes the CDI specs the runtime resolves the names against, and writes the
// runtime identity back to the pod. It also reclaims the instances of pods that ended.
package allocate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/deviceplugin/cdi"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/instances"
	"github.com/dynamig/dynamig/deviceplugin/metrics"
	"github.com/dynamig/dynamig/deviceplugin/podresources"
	"github.com/dynamig/dynamig/deviceplugin/runtimecdi"
	"github.com/dynamig/dynamig/plugins/dynamicmig/request"
	"github.com/dynamig/dynamig/signing"
)

// OwnerFinder says which container holds a set of device IDs, and which IDs the node's
// containers hold (the kubelet's PodResources).
type OwnerFinder interface {
	Find(ctx context.Context, resource string, deviceIDs []string) (podresources.Owner, error)
	Held(ctx context.Context, resource string) (map[string]bool, error)
}

// Options configure an Allocator.
type Options struct {
	NodeName   string
	Client     kubernetes.Interface
	Names      config.ResourceNames
	Instances  *instances.Manager
	Checkpoint *checkpoint.Checkpoint
	// Verifier checks each reservation's signature before anything is created.
	Verifier *signing.Verifier
	// Owners finds the container of a PreStartContainer call.
	Owners OwnerFinder
	// Specs writes the CDI specs of the device IDs.
	Specs *cdi.Specs
	// DeviceEdits says what a container gets for its devices' UUIDs (default cdi.EnvOnly:
	// NVIDIA_VISIBLE_DEVICES only).
	DeviceEdits cdi.DeviceEdits
	// Pods, if set, is an informer's view of this node's pods, read before the API server.
	Pods corelisters.PodLister
	// Recorder, if set, receives the events on pods (events.go): a Warning for every refusal
	// and failure, a Normal one for what a container got and for a reclaim.
	Recorder record.EventRecorder
	// PreemptionWait bounds how long PreStartContainer waits, within the kubelet's deadline,
	// for an instance of a pod being deleted to go from the reserved placement before it
	// says so and lets the kubelet retry (default 10 s).
	PreemptionWait time.Duration
	// Poll is how often it looks again while waiting (default 250 ms).
	Poll time.Duration
	// HAMiCore configures shared (hami-core) GPUs.
	HAMiCore HAMiCoreOptions
	// RuntimeCDI, if set, is what is known of the container runtime's CDI support: a
	// container started on a runtime that ignores CDI gets a Warning (ReasonCDINotApplied).
	RuntimeCDI func() runtimecdi.Verdict
}

// Allocator serves kubelet's Allocate and PreStartContainer calls.
type Allocator struct {
	opts Options
	// specs serialises the CDI spec writes and removals of PreStart with SweepSpecs, so a
	// sweep never removes a spec written after it read which IDs are held.
	specs sync.Mutex
}

// New checks the options.
func New(opts Options) (*Allocator, error) {
	switch {
	case opts.NodeName == "":
		return nil, errors.New("allocate: NodeName is required")
	case opts.Client == nil || opts.Instances == nil || opts.Checkpoint == nil || opts.Verifier == nil || opts.Owners == nil || opts.Specs == nil:
		return nil, errors.New("allocate: Client, Instances, Checkpoint, Verifier, Owners and Specs are required")
	}
	if opts.Names.ResourceCountName == "" {
		opts.Names = config.DefaultResourceNames()
	}
	if opts.PreemptionWait == 0 {
		opts.PreemptionWait = 10 * time.Second
	}
	if opts.Poll == 0 {
		opts.Poll = 250 * time.Millisecond
	}
	if opts.DeviceEdits == nil {
		opts.DeviceEdits = cdi.EnvOnly{}
	}
	return &Allocator{opts: opts}, nil
}

// Failure reasons of PreStartContainer, the label of its error metric.
const (
	reasonAttribution = "attribution" // whose call it is cannot be told
	reasonTampered    = "tampered"
	reasonCreate      = "create"
	reasonBusy        = "busy" // the placement is held by an instance that is going away
	reasonWriteBack   = "write_back"
	reasonSpec        = "cdi_spec"
)

// failure is an error with its metric reason; final ones can never be realised on this node.
type failure struct {
	reason string
	final  bool
	err    error
	// device names the reservation it happened on, when there is one, for the event.
	device string
}

func (e *failure) Error() string { return e.err.Error() }
func (e *failure) Unwrap() error { return e.err }

// because marks an error the kubelet's retry may get past.
func because(reason string, err error) error { return &failure{reason: reason, err: err} }

// never marks an error no retry gets past: the pod is marked failed, and evicted by the scheduler.
func never(reason string, err error) error { return &failure{reason: reason, final: true, err: err} }

// onDevice notes the reservation a failure happened on.
func onDevice(r api.MigReservation, err error) error {
	var f *failure
	if errors.As(err, &f) && f.device == "" {
		f.device = fmt.Sprintf("device %d (%s at %s on %s)", r.DeviceIndex, r.Profile, r.Placement, r.GPUUUID)
	}
	return err
}

// container is what PreStartContainer learnt of the container it prepares: its pod and
// name once attributed, then what it got.
type container struct {
	pod    *v1.Pod
	name   string
	made   []made               // MIG instances
	shares []api.HAMiCoreDevice // hami-core shares
}

// Allocate answers each device ID with its CDI device name and creates nothing: the
// container's devices are realised at PreStartContainer, when the kubelet can say whose
// they are. It also answers NVIDIA_VISIBLE_DEVICES=void: the kubelet passes it to the
// runtime as the container's own environment, which replaces the image's (CUDA images set
// all) and which the CDI spec's NVIDIA_VISIBLE_DEVICES replaces in turn when the runtime
// applies CDI (the CDI library's edits replace a variable of the same name). A runtime that
// ignores CDI names (containerd 1.7 with enable_cdi = false) so starts the container with
// no GPU, never with every GPU of the node or another pod's.
func (a *Allocator) Allocate(_ context.Context, req *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error) {
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{cdi.VisibleDevicesEnv: cdi.NoDevices}}
	for _, id := range req.GetDevicesIds() {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: cdi.QualifiedName(a.opts.NodeName, id)})
	}
	return resp, nil
}

// PreStartContainer realises the reservation of the container that holds deviceIDs and
// writes their CDI specs; Normal events on the pod say what the container got. An error
// keeps the kubelet from creating the container; it retries with backoff, and a Warning
// event says why. A reservation that can never be realised here also fails the pod's bind
// phase, and dynamig-scheduler evicts the pod, so its controller recreates it and the
// scheduler places it elsewhere.
func (a *Allocator) PreStartContainer(ctx context.Context, deviceIDs []string) error {
	start := time.Now()
	c, err := a.preStart(ctx, deviceIDs)
	reason := ""
	if err != nil {
		// A refused container resolves nothing: no spec may still name what an earlier
		// holder of its IDs got.
		if rmErr := a.removeSpecs(deviceIDs); rmErr != nil {
			err = fmt.Errorf("%w; %w", err, rmErr)
		}
		reason = a.refused(ctx, c, err)
	} else {
		a.started(c)
	}
	metrics.ObservePreStart(start, reason)
	return err
}

// preStart returns the container as far as it got: nil until it is attributed.
func (a *Allocator) preStart(ctx context.Context, deviceIDs []string) (*container, error) {
	resource := a.opts.Names.ResourceCountName
	owner, err := a.opts.Owners.Find(ctx, resource, deviceIDs)
	if err != nil {
		return nil, because(reasonAttribution, err)
	}
	pod, err := a.pod(ctx, owner)
	if err != nil {
		return nil, because(reasonAttribution, err)
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod), "container", owner.Container)
	ctx = klog.NewContext(ctx, logger)
	idx, ok := request.ContainerIndex(pod, owner.Container)
	if !ok {
		return nil, because(reasonAttribution, fmt.Errorf("pod %s/%s has no container %q that PodResources names", pod.Namespace, pod.Name, owner.Container))
	}
	c := &container{pod: pod, name: owner.Container}
	// Nothing is created for a reservation the scheduler did not sign for this pod and node.
	// A key rotated away since is no reason to evict a running pod: what the checkpoint
	// records for this pod UID was verified when it was made, and is adopted (or made again
	// after a reboot) at exactly the recorded placements.
	if err := a.opts.Verifier.Verify(pod); err != nil {
		if !signing.IsUnknownKey(err) || !a.recorded(pod, idx) {
			return c, never(reasonTampered, err)
		}
		logger.Info("Reservation signed by a key no longer accepted; adopting what the checkpoint records for the pod", "reason", err.Error())
	}
	ids := slices.Sorted(slices.Values(deviceIDs))
	var edits specs.ContainerEdits
	switch {
	case pod.Annotations[api.MigReservationsAnnotation] != "":
		if edits, err = a.preStartMIG(ctx, c, idx, ids); err != nil {
			return c, err
		}
	case pod.Annotations[api.DevicesAllocatedAnnotation] != "":
		if edits, err = a.preStartHAMiCore(ctx, c, idx, ids); err != nil {
			return c, err
		}
	default:
		return c, never(reasonAttribution, fmt.Errorf("pod %s/%s holds %s devices but carries neither %s nor %s: it was not scheduled by dynamig-scheduler",
			pod.Namespace, pod.Name, resource, api.MigReservationsAnnotation, api.DevicesAllocatedAnnotation))
	}
	if err := a.writeSpecs(ctx, ids, edits); err != nil {
		return c, because(reasonSpec, err)
	}
	logger.V(2).Info("Container devices ready", "devices", ids)
	return c, nil
}

// pod reads the owner's pod. PodResources names it by namespace and name only, and the
// informer may lag behind the Binding or still show an ended pod whose name a new pod took
// (a deleted terminal pod is never seen with a deletionTimestamp). So the informer's pod is
// taken only when it is bound here, live, and PreStart will write to it: that patch holds
// only for the pod's UID (patchAnnotations), so the API confirms it is the same pod before
// the container starts. Otherwise (a container restart
// adopting its instances writes nothing) the pod is read from the API server.
func (a *Allocator) pod(ctx context.Context, o podresources.Owner) (*v1.Pod, error) {
	if a.opts.Pods != nil {
		if p, err := a.opts.Pods.Pods(o.Namespace).Get(o.Pod); err == nil && p.Spec.NodeName == a.opts.NodeName && p.DeletionTimestamp == nil && !ended(p) && writesTo(p, o.Container) {
			return p, nil
		}
	}
	p, err := a.opts.Client.CoreV1().Pods(o.Namespace).Get(ctx, o.Pod, metav1.GetOptions{})
	switch {
	case err != nil:
		return nil, fmt.Errorf("reading pod %s/%s, which holds the devices: %w", o.Namespace, o.Pod, err)
	case p.Spec.NodeName != a.opts.NodeName:
		return nil, fmt.Errorf("pod %s/%s is bound to %q, not this node %s", o.Namespace, o.Pod, p.Spec.NodeName, a.opts.NodeName)
	}
	return p, nil
}

// writeSpecs writes one CDI spec per device ID, each with the container's whole edits: the
// CDI library applies equal edits idempotently (an environment variable, mount or device
// node of the same name replaces the earlier one; nvcdi's hooks may run once per device ID
// and are idempotent), and a spec must not be empty.
//
// A call that outlived the kubelet's deadline writes nothing: the kubelet gave up on it (and
// retries), and its pod may be gone since.
func (a *Allocator) writeSpecs(ctx context.Context, ids []string, edits specs.ContainerEdits) error {
	a.specs.Lock()
	defer a.specs.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("not writing the CDI specs: the kubelet's call ended (%w)", err)
	}
	for _, id := range ids {
		if err := a.opts.Specs.Write(a.opts.NodeName, id, edits); err != nil {
			return err
		}
	}
	return nil
}

// recorded says whether the checkpoint records every MIG reservation of the container for
// this pod UID, as created at exactly its GPU, profile and placement.
func (a *Allocator) recorded(pod *v1.Pod, idx int) bool {
	recs, err := api.DecodeMigReservations(pod.Annotations[api.MigReservationsAnnotation])
	mine := containerReservations(recs, idx)
	if err != nil || len(mine) == 0 {
		return false
	}
	for _, r := range mine {
		e, ok := a.opts.Checkpoint.Get(checkpoint.Key{PodUID: string(pod.UID), ContainerIndex: r.ContainerIndex, DeviceIndex: r.DeviceIndex})
		if !ok || e.State != checkpoint.Created || e.GPUUUID != r.GPUUUID || e.Profile != r.Profile || e.Placement != r.Placement {
			return false
		}
	}
	return true
}

// removeSpecs removes the CDI specs of the device IDs.
func (a *Allocator) removeSpecs(ids []string) error {
	a.specs.Lock()
	defer a.specs.Unlock()
	var errs []error
	for _, id := range ids {
		errs = append(errs, a.opts.Specs.Remove(a.opts.NodeName, id))
	}
	return errors.Join(errs...)
}

// SweepSpecs removes the CDI specs of device IDs that no container holds any more (the
// kubelet's PodResources): a spec lives as long as its container, so one the kubelet
// resolves without calling PreStart (after its restart, before this plugin registers
// again) can never name a device another pod got. An unreadable PodResources removes
// nothing. The reconcile loop and restart recovery run it.
func (a *Allocator) SweepSpecs(ctx context.Context) error {
	a.specs.Lock()
	defer a.specs.Unlock()
	held, err := a.opts.Owners.Held(ctx, a.opts.Names.ResourceCountName)
	if err != nil {
		return fmt.Errorf("not removing CDI specs: %w", err)
	}
	removed, err := a.opts.Specs.RemoveExcept(a.opts.NodeName, held)
	if removed > 0 {
		klog.FromContext(ctx).V(2).Info("Removed the CDI specs of devices no container holds", "specs", removed)
	}
	return err
}

// preStartMIG realises the container's MIG reservations (c.made) and returns what the
// container gets.
func (a *Allocator) preStartMIG(ctx context.Context, c *container, idx int, ids []string) (specs.ContainerEdits, error) {
	pod := c.pod
	recs, err := api.DecodeMigReservations(pod.Annotations[api.MigReservationsAnnotation])
	if err != nil {
		return specs.ContainerEdits{}, never(reasonTampered, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	mine := containerReservations(recs, idx)
	if len(mine) != len(ids) {
		return specs.ContainerEdits{}, never(reasonAttribution, fmt.Errorf("pod %s/%s container %d has %d MIG reservations but the kubelet gave it %d devices", pod.Namespace, pod.Name, idx, len(mine), len(ids)))
	}
	made, err := a.realise(ctx, pod, mine)
	if err != nil {
		return specs.ContainerEdits{}, err
	}
	if err := a.writeBack(ctx, pod, made); err != nil {
		return specs.ContainerEdits{}, because(reasonWriteBack, err)
	}
	c.made = made
	uuids := make([]string, len(made))
	for i, in := range made {
		uuids[i] = in.MigUUID
	}
	edits, err := a.opts.DeviceEdits.Edits(uuids)
	if err != nil {
		return specs.ContainerEdits{}, because(reasonSpec, err)
	}
	return edits, nil
}

// writesTo says whether PreStart of the container will write to its pod: a MIG
// reservation of it not realised yet, or a hami-core assignment of it not consumed yet.
func writesTo(p *v1.Pod, container string) bool {
	idx, ok := request.ContainerIndex(p, container)
	if !ok {
		return false
	}
	if raw := p.Annotations[api.MigReservationsAnnotation]; raw != "" {
		recs, err := api.DecodeMigReservations(raw)
		return err == nil && slices.ContainsFunc(containerReservations(recs, idx), func(r api.MigReservation) bool { return !r.Realized() })
	}
	pending, err := api.DecodeHAMiCoreDevices(api.DevicesToAllocateAnnotation, p.Annotations[api.DevicesToAllocateAnnotation])
	return err == nil && idx < len(pending) && len(pending[idx]) > 0
}

func ended(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
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

// realise adopts or creates the container's instances; on a failure it destroys those this
// call created.
func (a *Allocator) realise(ctx context.Context, pod *v1.Pod, recs []api.MigReservation) ([]made, error) {
	var out []made
	for _, r := range recs {
		m, err := a.realiseOne(ctx, pod, r)
		if err != nil {
			for _, done := range out {
				if !done.created {
					continue
				}
				if uErr := a.undo(ctx, pod, done); uErr != nil {
					err = fmt.Errorf("%w; %w", err, uErr)
				}
			}
			return nil, onDevice(r, err)
		}
		out = append(out, m)
	}
	return out, nil
}

func (a *Allocator) realiseOne(ctx context.Context, pod *v1.Pod, r api.MigReservation) (made, error) {
	key := checkpoint.Key{PodUID: string(pod.UID), ContainerIndex: r.ContainerIndex, DeviceIndex: r.DeviceIndex}
	which := fmt.Sprintf("pod %s/%s container %d device %d", pod.Namespace, pod.Name, r.ContainerIndex, r.DeviceIndex)
	if _, err := a.opts.Instances.ProfileID(r.GPUUUID, r.Profile, r.Placement); instances.IsUnrealisable(err) {
		return made{}, never(reasonTampered, fmt.Errorf("%s: %w", which, err))
	} else if err != nil { // NVML did not answer (the GPU fell off the bus, for one): the kubelet retries
		return made{}, because(reasonCreate, fmt.Errorf("%s: %w", which, err))
	}
	lock := &gpuLock{mgr: a.opts.Instances, gpu: r.GPUUUID}
	if err := lock.take(); err != nil {
		return made{}, because(reasonCreate, err)
	}
	defer lock.release()
	// The instance this plugin already made for this pod, container and device: a container
	// restart, or a kubelet or plugin restart, adopts it.
	if e, ok := a.opts.Checkpoint.Get(key); ok {
		if e.State == checkpoint.Created {
			in, state, err := a.find(r.GPUUUID, e)
			switch {
			case err != nil:
				return made{}, because(reasonCreate, fmt.Errorf("%s: %w", which, err))
			case state == whole:
				return made{Instance: in, containerIndex: r.ContainerIndex, deviceIndex: r.DeviceIndex}, nil
			case state == halfDestroyed:
				// A destroy that failed half way (a rollback): finished, then made again below.
				if err := a.opts.Instances.Destroy(ctx, r.GPUUUID, in.GPUInstanceID); err != nil {
					return made{}, because(reasonCreate, fmt.Errorf("%s: destroying what a failed destroy left of its instance: %w", which, err))
				}
				klog.FromContext(ctx).Info("Destroyed what a failed destroy left of the pod's MIG instance; creating it again", "gpu", r.GPUUUID, "placement", r.Placement.String(), "oldMigUUID", e.MigUUID)
			default:
				// Gone (the node rebooted): made again below, at the same placement.
				klog.FromContext(ctx).Info("The pod's MIG instance is gone; creating it again", "gpu", r.GPUUUID, "placement", r.Placement.String(), "oldMigUUID", e.MigUUID)
			}
		} else if err := a.finishIntent(ctx, e); err != nil {
			return made{}, because(reasonCreate, err)
		}
	}
	if err := a.clearPlacement(ctx, pod, r, lock); err != nil {
		return made{}, err
	}
	entry := checkpoint.Entry{Key: key, PodNamespace: pod.Namespace, PodName: pod.Name, GPUUUID: r.GPUUUID, Profile: r.Profile, Placement: r.Placement, State: checkpoint.Intent}
	if err := a.opts.Checkpoint.Put(entry); err != nil {
		return made{}, because(reasonCreate, fmt.Errorf("recording the intent before creating: %w", err))
	}
	in, err := a.opts.Instances.Create(ctx, r.GPUUUID, r.Profile, r.Placement)
	if err != nil {
		err = fmt.Errorf("%s: %w", which, err)
		if instances.IsLeftBehind(err) {
			// Its rollback failed: the intent stays, accounting for what is left, which
			// the kubelet's retry (finishIntent) or the reclaim of an ended pod destroys.
			return made{}, because(reasonCreate, err)
		}
		// Create rolled back, so nothing is left; an intent that cannot be forgotten stays,
		// and claims nothing another pod makes at this placement (destroyAt).
		if rmErr := a.opts.Checkpoint.Remove(key); rmErr != nil {
			err = fmt.Errorf("%w; forgetting the intent: %w", err, rmErr)
		}
		return made{}, because(reasonCreate, err)
	}
	entry.State, entry.GPUInstanceID, entry.ComputeInstanceID, entry.MigUUID = checkpoint.Created, in.GPUInstanceID, in.ComputeInstanceID, in.MigUUID
	if err := a.opts.Checkpoint.Put(entry); err != nil {
		// An instance the checkpoint does not record is not handed out: the create rolls
		// back. If the destroy fails, the intent still recorded is what names it as ours.
		err = fmt.Errorf("%s: recording the created instance: %w", which, err)
		if dErr := a.opts.Instances.Destroy(ctx, r.GPUUUID, in.GPUInstanceID); dErr != nil {
			err = fmt.Errorf("%w; rolling it back: %w", err, dErr)
		} else if rmErr := a.opts.Checkpoint.Remove(key); rmErr != nil {
			err = fmt.Errorf("%w; forgetting the intent: %w", err, rmErr)
		}
		return made{}, because(reasonCreate, err)
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

// instanceState is what NVML shows of a created entry's instance.
type instanceState int

const (
	gone          instanceState = iota
	whole                       // its GPU and compute instance, as recorded
	halfDestroyed               // its GPU instance without its compute instance: a destroy failed half way
)

// find looks the checkpoint's instance up in NVML by its complete identity. A GPU NVML
// cannot list (fallen off the bus) is an error, never "gone": its instances may come back.
func (a *Allocator) find(gpu string, e checkpoint.Entry) (instances.Instance, instanceState, error) {
	list, err := a.opts.Instances.List(gpu)
	if err != nil {
		return instances.Instance{}, gone, err
	}
	for _, in := range list {
		switch {
		case records(e, in):
			return in, whole, nil
		case leftOf(e, in):
			return in, halfDestroyed, nil
		}
	}
	return instances.Instance{}, gone, nil
}

// clearPlacement makes sure nothing occupies the reserved placement: an overlapping
// instance of an ended pod is reclaimed, and one of a pod being deleted (a preemption
// victim) is waited for, bounded, then reported so the kubelet retries. Only instances
// overlapping the placement are looked at, so a create reads no pod in the common case
// (the reconcile loop reclaims the rest). The GPU lock is held, and let go of while it waits,
// so the GPU's other containers start and reclaim runs meanwhile.
func (a *Allocator) clearPlacement(ctx context.Context, pod *v1.Pod, r api.MigReservation, lock *gpuLock) error {
	deadline := time.Now().Add(a.opts.PreemptionWait)
	for {
		blocker, err := a.blocker(ctx, r)
		if err != nil || blocker == "" {
			return err
		}
		if time.Now().After(deadline) {
			return because(reasonBusy, fmt.Errorf("pod %s/%s container %d device %d: placement %s of %s is still held by %s",
				pod.Namespace, pod.Name, r.ContainerIndex, r.DeviceIndex, r.Placement, r.GPUUUID, blocker))
		}
		lock.release()
		select {
		case <-ctx.Done():
			return because(reasonBusy, fmt.Errorf("placement %s of %s is held by %s: %w", r.Placement, r.GPUUUID, blocker, ctx.Err()))
		case <-time.After(a.opts.Poll):
		}
		if err := lock.take(); err != nil {
			return because(reasonCreate, err)
		}
	}
}

// gpuLock is a GPU's mutation lock that a wait can let go of and take again.
type gpuLock struct {
	mgr    *instances.Manager
	gpu    string
	unlock func()
}

func (l *gpuLock) take() (err error) {
	l.unlock, err = l.mgr.Lock(l.gpu)
	return err
}

// release lets go of the lock if it is held.
func (l *gpuLock) release() {
	if l.unlock != nil {
		l.unlock()
		l.unlock = nil
	}
}

// blocker reclaims the overlapping instances whose pods ended and names what holds one
// that may still go (a pod being deleted), or returns the final error of one that will not.
func (a *Allocator) blocker(ctx context.Context, r api.MigReservation) (string, error) {
	list, err := a.opts.Instances.List(r.GPUUUID)
	if err != nil {
		return "", because(reasonCreate, err)
	}
	for _, in := range list {
		if !in.Placement.Overlaps(r.Placement) {
			continue
		}
		owner, ok := a.owner(in)
		if !ok {
			return "", never(reasonCreate, fmt.Errorf("placement %s of %s overlaps GPU instance %d at %s, which dynamig did not create; refusing", r.Placement, r.GPUUUID, in.GPUInstanceID, in.Placement))
		}
		p, err := a.ownerPod(ctx, owner)
		switch {
		case err != nil:
			return "", because(reasonCreate, err)
		case p == nil || ended(p):
			// Ended, from a direct read of the API: reclaim it and look again.
			if err := a.reclaim(ctx, owner, p); err != nil {
				return "", because(reasonCreate, err)
			}
			return a.blocker(ctx, r)
		case p.DeletionTimestamp == nil:
			return "", never(reasonCreate, fmt.Errorf("placement %s of %s overlaps the instance of running pod %s/%s: the reservation would double-book it", r.Placement, r.GPUUUID, p.Namespace, p.Name))
		}
		return fmt.Sprintf("the instance of pod %s/%s, which is going away", owner.PodNamespace, owner.PodName), nil
	}
	return "", nil
}

// owner finds the checkpoint entry of an instance: the created entry that records it, else
// an intent at its placement and profile whose interrupted create may have made it.
func (a *Allocator) owner(in instances.Instance) (checkpoint.Entry, bool) {
	entries := a.opts.Checkpoint.Entries()
	for _, e := range entries {
		if records(e, in) || leftOf(e, in) {
			return e, true
		}
	}
	for _, e := range entries {
		if e.State == checkpoint.Intent && e.GPUUUID == in.GPUUUID && e.Placement == in.Placement && e.Profile == in.Profile {
			return e, true
		}
	}
	return checkpoint.Entry{}, false
}

// records says whether a created entry is the instance's: its GPU, placement, GI id and MIG
// UUID (GI ids are reused, MIG UUIDs never; a created entry's instance is complete).
func records(e checkpoint.Entry, in instances.Instance) bool {
	return e.State == checkpoint.Created && in.Complete && e.GPUUUID == in.GPUUUID && e.Placement == in.Placement &&
		e.GPUInstanceID == in.GPUInstanceID && e.MigUUID == in.MigUUID
}

// leftOf says whether the instance is what a failed destroy left of a created entry's: its
// GPU instance (the GPU, placement, profile and id recorded) without a compute instance.
// Destroys run under the GPU lock, which every create of this plugin holds too, so no
// other create of ours can have made it there meanwhile.
func leftOf(e checkpoint.Entry, in instances.Instance) bool {
	return e.State == checkpoint.Created && !in.Complete && in.ComputeInstanceID < 0 && e.GPUUUID == in.GPUUUID && e.Placement == in.Placement &&
		e.GPUInstanceID == in.GPUInstanceID && e.Profile == in.Profile
}

// recordedForOther says whether an entry other than the intent's records the instance.
func (a *Allocator) recordedForOther(intent checkpoint.Entry, in instances.Instance) bool {
	for _, e := range a.opts.Checkpoint.Entries() {
		if e.Key != intent.Key && records(e, in) {
			return true
		}
	}
	return false
}

// undo destroys an instance this call created and forgets it. On a failure its entry stays:
// the kubelet's retry adopts the instance, or makes it again if it is gone.
func (a *Allocator) undo(ctx context.Context, pod *v1.Pod, m made) error {
	unlock, err := a.opts.Instances.Lock(m.GPUUUID)
	if err != nil {
		return err
	}
	defer unlock()
	if err := a.opts.Instances.Destroy(ctx, m.GPUUUID, m.GPUInstanceID); err != nil {
		return fmt.Errorf("rolling back device %d: %w", m.deviceIndex, err)
	}
	if err := a.opts.Checkpoint.Remove(checkpoint.Key{PodUID: string(pod.UID), ContainerIndex: m.containerIndex, DeviceIndex: m.deviceIndex}); err != nil {
		return fmt.Errorf("rolling back device %d: %w", m.deviceIndex, err)
	}
	return nil
}
