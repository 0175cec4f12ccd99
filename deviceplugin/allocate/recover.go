package allocate

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/instances"
	"github.com/dynamig/dynamig/deviceplugin/metrics"
)

// Report is what restart recovery found and did.
type Report struct {
	// Adopted instances are ours (checkpoint or a pod's reservation names their complete
	// identity) and stay.
	Adopted []instances.Instance
	// Reclaimed instances belonged to pods that ended; RolledBack ones were half made.
	Reclaimed, RolledBack []instances.Instance
	// Unknown instances are in neither the checkpoint nor any reservation; they are left
	// alone unless reclaimUnknown is set and they carry no process.
	Unknown []instances.Instance
	// Lost lists checkpoint entries whose instance NVML no longer has.
	Lost []checkpoint.Entry
	// Legacy lists HAMi template/slot identities (GPU-UUID[template-slot]) seen on pods.
	Legacy []string
	// Kept explains instances left in place that recovery would otherwise have removed.
	Kept []string
}

// legacyIdentity matches HAMi's pre-v2.10 MIG identities, GPU-UUID[template-slot].
var legacyIdentity = regexp.MustCompile(`GPU-[0-9a-fA-F-]+\[\d+-\d+\]`)

// Recover runs once at start, before kubelet is served. It combines the checkpoint, the
// reservations of this node's pods (one complete LIST) and NVML: it adopts instances whose
// complete runtime identity matches, finishes or rolls back what the checkpoint shows half
// done, reclaims our instances whose pods ended, and reports the rest. It never destroys an
// instance that carries a process or that a reservation names; when the pods cannot be
// listed it only reports.
func (a *Allocator) Recover(ctx context.Context, reclaimUnknown bool) (Report, error) {
	logger := klog.FromContext(ctx)
	var rep Report
	list, listErr := a.opts.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + a.opts.NodeName})
	destructive := listErr == nil
	if listErr != nil {
		logger.Error(listErr, "Cannot list this node's pods: recovery only reports, destroys nothing")
	}
	named := map[string]naming{} // by migUUID: instances a live pod's reservation names
	pods := map[string]*v1.Pod{} // by UID: this node's pods
	legacyGPUs := map[string]bool{}
	if list != nil {
		for i := range list.Items {
			p := &list.Items[i]
			if p.Spec.NodeName != a.opts.NodeName {
				continue
			}
			pods[string(p.UID)] = p
			for _, raw := range []string{p.Annotations[api.DevicesAllocatedAnnotation], p.Annotations[api.DevicesToAllocateAnnotation]} {
				for _, id := range legacyIdentity.FindAllString(raw, -1) {
					rep.Legacy = append(rep.Legacy, fmt.Sprintf("%s/%s: %s", p.Namespace, p.Name, id))
					legacyGPUs[id[:strings.IndexByte(id, '[')]] = true
				}
			}
			raw, ok := p.Annotations[api.MigReservationsAnnotation]
			if !ok {
				continue
			}
			recs, err := api.DecodeMigReservations(raw)
			if err != nil {
				logger.Error(err, "Unreadable reservation: recovery destroys nothing", "pod", klog.KObj(p))
				destructive = false
				continue
			}
			for _, r := range recs {
				if r.Realized() && !ended(p) {
					named[r.MigUUID] = naming{MigReservation: r, podUID: string(p.UID)}
				}
			}
		}
	}

	errs := []error{listErr}
	for _, gpu := range a.opts.Instances.GPUs() {
		unlock, err := a.opts.Instances.Lock(gpu)
		if err != nil {
			return rep, err
		}
		// A GPU whose recovery failed does not keep the other GPUs from theirs.
		errs = append(errs, a.recoverGPU(ctx, gpu, &rep, named, pods, destructive, reclaimUnknown && !legacyGPUs[gpu]))
		unlock()
	}
	for action, n := range map[string]int{"adopted": len(rep.Adopted), "reclaimed": len(rep.Reclaimed), "rolled_back": len(rep.RolledBack),
		"unknown": len(rep.Unknown), "lost": len(rep.Lost), "kept": len(rep.Kept)} {
		metrics.ObserveActions(action, n)
	}
	logger.Info("Recovered MIG instances", "adopted", len(rep.Adopted), "reclaimed", len(rep.Reclaimed), "rolledBack", len(rep.RolledBack),
		"unknown", len(rep.Unknown), "lost", len(rep.Lost), "legacy", len(rep.Legacy))
	for _, in := range rep.Unknown {
		logger.Info("MIG instance not created by dynamig: left alone", "gpu", in.GPUUUID, "profile", in.Profile, "placement", in.Placement.String(), "gpuInstanceID", in.GPUInstanceID, "processes", len(in.Processes))
	}
	for _, l := range rep.Legacy {
		logger.Info("HAMi template/slot identity: reported, not adopted, not destroyed", "identity", l)
	}
	return rep, errors.Join(errs...)
}

// naming is a realised reservation of a live pod.
type naming struct {
	api.MigReservation
	podUID string
}

func (a *Allocator) recoverGPU(ctx context.Context, gpu string, rep *Report, named map[string]naming, pods map[string]*v1.Pod, destructive, reclaimUnknown bool) error {
	present, err := a.opts.Instances.List(gpu)
	if err != nil {
		return err
	}
	claimed := map[int]bool{} // GI ids accounted for
	// A destroy that fails (a process started since the listing: NVML IN_USE) keeps that
	// instance and its entry, and recovery goes on with the others; destroy says false then.
	var failed []error
	destroy := func(in instances.Instance, into *[]instances.Instance, why string) bool {
		switch {
		case len(in.Processes) > 0:
			rep.Kept = append(rep.Kept, fmt.Sprintf("GPU instance %d on %s (%s) carries processes %v: kept", in.GPUInstanceID, gpu, why, in.Processes))
			return true
		case in.MigUUID != "" && named[in.MigUUID].MigUUID != "":
			rep.Kept = append(rep.Kept, fmt.Sprintf("GPU instance %d on %s (%s) is named by a reservation: kept", in.GPUInstanceID, gpu, why))
			return true
		case !destructive:
			rep.Kept = append(rep.Kept, fmt.Sprintf("GPU instance %d on %s (%s): the API could not be read completely, kept", in.GPUInstanceID, gpu, why))
			return true
		}
		if err := a.opts.Instances.Destroy(ctx, gpu, in.GPUInstanceID); err != nil {
			err = fmt.Errorf("GPU instance %d on %s (%s): %w", in.GPUInstanceID, gpu, why, err)
			klog.FromContext(ctx).Error(err, "Recovery could not destroy a MIG instance; kept")
			rep.Kept = append(rep.Kept, fmt.Sprintf("%v: kept", err))
			failed = append(failed, err)
			return false
		}
		*into = append(*into, in)
		return true
	}
	for _, e := range a.opts.Checkpoint.Entries() {
		if e.GPUUUID != gpu {
			continue
		}
		var match *instances.Instance
		for i := range present {
			in := &present[i]
			if in.Placement != e.Placement || in.Profile != e.Profile {
				continue
			}
			// An intent matches what its interrupted create may have left, never an instance
			// another entry records or another pod's reservation names.
			namer := named[in.MigUUID].podUID
			if (e.State == checkpoint.Created && in.GPUInstanceID == e.GPUInstanceID) ||
				(e.State == checkpoint.Intent && !a.recordedForOther(e, *in) && (namer == "" || namer == e.PodUID)) {
				match = in
			}
		}
		pod := pods[e.PodUID]
		alive := pod != nil && !ended(pod)
		switch {
		case match == nil:
			if e.State == checkpoint.Created {
				rep.Lost = append(rep.Lost, e)
			}
			if e.State == checkpoint.Created && alive {
				// Gone with the node's reboot while its pod lives: the pod's next container
				// start makes it again at the recorded placement, and the record is what
				// lets it do so under a signing key retired since.
				continue
			}
			if err := a.opts.Checkpoint.Remove(e.Key); err != nil {
				return err
			}
		case !alive:
			claimed[match.GPUInstanceID] = true
			reclaimed := len(rep.Reclaimed)
			if !destroy(*match, &rep.Reclaimed, "its pod ended") {
				continue
			}
			if len(rep.Reclaimed) > reclaimed && e.State == checkpoint.Created {
				a.reclaimed(e, pod)
			}
			if destructive && len(match.Processes) == 0 {
				if err := a.opts.Checkpoint.Remove(e.Key); err != nil {
					return err
				}
			}
		case e.State == checkpoint.Intent && match.Complete && named[match.MigUUID].MigUUID != "":
			// The create finished and the pod was told; only the result was not recorded.
			claimed[match.GPUInstanceID] = true
			e.State, e.GPUInstanceID, e.ComputeInstanceID, e.MigUUID = checkpoint.Created, match.GPUInstanceID, match.ComputeInstanceID, match.MigUUID
			if err := a.opts.Checkpoint.Put(e); err != nil {
				return err
			}
			rep.Adopted = append(rep.Adopted, *match)
		case e.State == checkpoint.Intent:
			// Half done and not handed to the pod: roll back; kubelet's Allocate retry or the
			// next admission re-creates it.
			claimed[match.GPUInstanceID] = true
			if !destroy(*match, &rep.RolledBack, "an interrupted create") {
				continue
			}
			if len(match.Processes) == 0 && destructive {
				if err := a.opts.Checkpoint.Remove(e.Key); err != nil {
					return err
				}
			}
		case match.Complete && match.MigUUID == e.MigUUID && match.ComputeInstanceID == e.ComputeInstanceID:
			claimed[match.GPUInstanceID] = true
			rep.Adopted = append(rep.Adopted, *match)
		default:
			claimed[match.GPUInstanceID] = true
			rep.Kept = append(rep.Kept, fmt.Sprintf("GPU instance %d on %s differs from the checkpoint (%s %s): kept for an operator", match.GPUInstanceID, gpu, e.Profile, e.Placement))
		}
	}
	for _, in := range present {
		if claimed[in.GPUInstanceID] {
			continue
		}
		if r, ok := named[in.MigUUID]; ok && in.Complete && r.GPUUUID == gpu && r.Placement == in.Placement && r.Profile == in.Profile &&
			*r.GPUInstanceID == uint32(in.GPUInstanceID) && *r.ComputeInstanceID == uint32(in.ComputeInstanceID) {
			// A reservation names it with its complete identity: ours (the checkpoint was lost).
			if p := pods[r.podUID]; p != nil {
				e := checkpoint.Entry{Key: checkpoint.Key{PodUID: string(p.UID), ContainerIndex: r.ContainerIndex, DeviceIndex: r.DeviceIndex},
					PodNamespace: p.Namespace, PodName: p.Name, GPUUUID: gpu, Profile: in.Profile, Placement: in.Placement,
					State: checkpoint.Created, GPUInstanceID: in.GPUInstanceID, ComputeInstanceID: in.ComputeInstanceID, MigUUID: in.MigUUID}
				if err := a.opts.Checkpoint.Put(e); err != nil {
					return err
				}
			}
			rep.Adopted = append(rep.Adopted, in)
			continue
		}
		rep.Unknown = append(rep.Unknown, in)
		if reclaimUnknown && len(in.Processes) == 0 {
			var gone []instances.Instance
			destroy(in, &gone, "not created by dynamig; --reclaim-unknown-instances")
		}
	}
	return errors.Join(failed...)
}
