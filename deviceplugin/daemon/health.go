package daemon

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/allocate"
	"github.com/dynamig/dynamig/deviceplugin/health"
	"github.com/dynamig/dynamig/deviceplugin/runtimecdi"
)

// Reasons of the GPU health events (docs/troubleshooting.md).
const (
	// ReasonGPUUnhealthy (Warning), on the Node and on the pods the GPU serves.
	ReasonGPUUnhealthy = "GPUUnhealthy"
	// ReasonGPUHealthy (Normal), on the Node: NVML says the GPU is healthy again.
	ReasonGPUHealthy = "GPUHealthy"
	// ReasonCDIApplied (Normal), on the Node: the runtime applies CDI devices (again).
	ReasonCDIApplied = "CDIApplied"
)

// runtimeCDIEvent tells on the Node a change of what the runtime does with CDI devices: a
// Warning (allocate.ReasonCDINotApplied) when it ignores them, a Normal event when it
// applies them after it did not. The pods started meanwhile get their own Warning.
func runtimeCDIEvent(recorder record.EventRecorder, node string, v runtimecdi.Verdict) {
	ref := &v1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}
	switch v.State {
	case runtimecdi.Ignores:
		recorder.Eventf(ref, v1.EventTypeWarning, allocate.ReasonCDINotApplied, "%s", allocate.CDINotAppliedMessage(v))
	case runtimecdi.Applies:
		recorder.Eventf(ref, v1.EventTypeNormal, ReasonCDIApplied, "the container runtime %s", v)
	}
}

// healthEvents tells a GPU's health change in events: on the Node, and when it turned
// unhealthy on every live pod of this node whose reservation names the GPU.
func healthEvents(ctx context.Context, recorder record.EventRecorder, node string, pods corelisters.PodLister, c health.Change) {
	ref := &v1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}
	if c.Healthy {
		recorder.Eventf(ref, v1.EventTypeNormal, ReasonGPUHealthy, "GPU %s is healthy again (was: %s): it takes new pods", c.GPUUUID, c.Reason)
		return
	}
	recorder.Eventf(ref, v1.EventTypeWarning, ReasonGPUUnhealthy, "GPU %s is unhealthy (%s): no new pods are placed on it", c.GPUUUID, c.Reason)
	list, err := pods.List(labels.Everything())
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing the node's pods for the GPU health event")
		return
	}
	for _, p := range list {
		if p.Spec.NodeName != node || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed || !usesGPU(p, c.GPUUUID) {
			continue
		}
		recorder.Eventf(p, v1.EventTypeWarning, ReasonGPUUnhealthy, "GPU %s, which this pod uses, is unhealthy (%s)", c.GPUUUID, c.Reason)
	}
}

// usesGPU says whether the pod's MIG reservation or hami-core assignment names the GPU.
func usesGPU(p *v1.Pod, gpu string) bool {
	if recs, err := api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation]); err == nil {
		for _, r := range recs {
			if r.GPUUUID == gpu {
				return true
			}
		}
	}
	if devs, err := api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, p.Annotations[api.DevicesAllocatedAnnotation]); err == nil {
		for _, ctr := range devs {
			for _, d := range ctr {
				if d.UUID == gpu {
					return true
				}
			}
		}
	}
	return false
}
