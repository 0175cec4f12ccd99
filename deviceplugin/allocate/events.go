package allocate

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/runtimecdi"
)

// Reasons of the events the device plugin records on pods (docs/troubleshooting.md lists
// them). Every refusal or failure of PreStartContainer whose pod is known gets a Warning;
// what a container got, and the reclaim of an ended pod's instance, get a Normal one.
const (
	// ReasonRealised (Normal): a MIG instance was created for a container.
	ReasonRealised = "Realised"
	// ReasonAdopted (Normal): a container (re)start got the MIG instance made for it before.
	ReasonAdopted = "Adopted"
	// ReasonShareAssigned (Normal): a container start got its hami-core share of a GPU.
	ReasonShareAssigned = "GPUShareAssigned"
	// ReasonReclaimed (Normal): the MIG instance of a container of an ended pod was destroyed.
	ReasonReclaimed = "Reclaimed"
	// ReasonRealisationFailed (Warning): PreStartContainer failed; the kubelet retries.
	ReasonRealisationFailed = "RealisationFailed"
	// ReasonPlacementBusy (Warning): the reserved placement is still held by the instance of
	// a pod being deleted; the kubelet retries.
	ReasonPlacementBusy = "PlacementBusy"
	// ReasonUnrealisable (Warning): the reservation can never be realised on its node; the
	// pod is marked failed, and evicted by dynamig-scheduler.
	ReasonUnrealisable = "ReservationNotRealisable"
	// ReasonCDINotApplied (Warning): the node's container runtime ignores CDI devices, so the
	// container starts with NVIDIA_VISIBLE_DEVICES=void and no GPU. Also on the Node.
	ReasonCDINotApplied = "CDINotApplied"
)

// CDINotAppliedMessage says what a runtime that ignores CDI does to GPU containers and how
// to turn CDI on, for the events on the Node and on the pods.
func CDINotAppliedMessage(v runtimecdi.Verdict) string {
	runtime := v.Runtime
	if runtime == "" {
		runtime = "of this node"
	}
	return fmt.Sprintf("the container runtime %s ignores CDI devices (%s): GPU containers start with NVIDIA_VISIBLE_DEVICES=void and no GPU. "+
		"Set enable_cdi = true and cdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"] under [plugins.\"io.containerd.grpc.v1.cri\"] and restart containerd "+
		"(or use containerd 2.x or CRI-O), then restart the pods", runtime, v.Why)
}

// eventf records an event on the pod when there is a recorder. The recorder's correlator
// folds the identical events of the kubelet's retries into one with a count.
func (a *Allocator) eventf(pod *v1.Pod, eventType, reason, format string, args ...any) {
	if a.opts.Recorder != nil {
		a.opts.Recorder.Eventf(pod, eventType, reason, format, args...)
	}
}

// refused reports a failed PreStartContainer and returns its metric reason. Once the pod is
// known a Warning event on it says which container and device failed and why: a final
// failure gives the pod up (fail), any other says the kubelet retries. Before that there is
// no pod to tell (or only one of the same name, which may be another): the log says it.
func (a *Allocator) refused(ctx context.Context, c *container, err error) string {
	logger := klog.FromContext(ctx)
	reason, final, device := "other", false, ""
	var f *failure
	if errors.As(err, &f) {
		reason, final, device = f.reason, f.final, f.device
	}
	if c == nil {
		logger.Error(err, "PreStartContainer refused before its pod was known; the kubelet will retry", "reason", reason)
		return reason
	}
	what := fmt.Sprintf("container %q", c.name)
	if device != "" {
		what += " " + device
	}
	if final {
		a.fail(ctx, c.pod, what, err)
		return reason
	}
	logger.Error(err, "PreStartContainer failed; the kubelet will retry", "pod", klog.KObj(c.pod), "container", c.name, "reason", reason)
	event := ReasonRealisationFailed
	if reason == reasonBusy {
		event = ReasonPlacementBusy
	}
	a.eventf(c.pod, v1.EventTypeWarning, event, "%s: %v; the kubelet will retry", what, err)
	return reason
}

// started says in Normal events what each device of a started container is, and in a
// Warning that it gets none of them when the runtime ignores CDI.
func (a *Allocator) started(c *container) {
	if a.opts.RuntimeCDI != nil {
		if v := a.opts.RuntimeCDI(); v.State == runtimecdi.Ignores {
			a.eventf(c.pod, v1.EventTypeWarning, ReasonCDINotApplied, "container %q: %s", c.name, CDINotAppliedMessage(v))
		}
	}
	for _, m := range c.made {
		reason, verb := ReasonAdopted, "adopted"
		if m.created {
			reason, verb = ReasonRealised, "created"
		}
		a.eventf(c.pod, v1.EventTypeNormal, reason, "container %q device %d: %s MIG instance %s (%s at %s on %s, GPU instance %d, compute instance %d)",
			c.name, m.deviceIndex, verb, m.MigUUID, m.Profile, m.Placement, m.GPUUUID, m.GPUInstanceID, m.ComputeInstanceID)
	}
	for i, d := range c.shares {
		a.eventf(c.pod, v1.EventTypeNormal, ReasonShareAssigned, "container %q device %d: hami-core share of %s: %d MiB, %d%% of its cores",
			c.name, i, d.UUID, d.MemoryMiB, d.Cores)
	}
}

// reclaimed tells an ended pod that the MIG instance one of its containers got was
// destroyed. A pod that is gone (nil) gets no event; the reclaim is only logged.
func (a *Allocator) reclaimed(e checkpoint.Entry, pod *v1.Pod) {
	if pod == nil {
		return
	}
	a.eventf(pod, v1.EventTypeNormal, ReasonReclaimed, "container %s device %d: destroyed MIG instance %s (%s at %s on %s, GPU instance %d): the pod is %s",
		containerName(pod, e.ContainerIndex), e.DeviceIndex, e.MigUUID, e.Profile, e.Placement, e.GPUUUID, e.GPUInstanceID, pod.Status.Phase)
}

// containerName quotes the name of the container at idx in the reservation's numbering.
func containerName(p *v1.Pod, idx int) string {
	if idx < len(p.Spec.InitContainers) {
		return fmt.Sprintf("%q", p.Spec.InitContainers[idx].Name)
	}
	if idx -= len(p.Spec.InitContainers); idx < len(p.Spec.Containers) {
		return fmt.Sprintf("%q", p.Spec.Containers[idx].Name)
	}
	return fmt.Sprintf("#%d", idx+len(p.Spec.InitContainers))
}
