// Package request parses a pod's GPU request: the count, memory and core resources of each
// container (init containers first) and the pod's GPU annotations. It imports no scheduler
// code, so it is fuzzed cheaply.
package request

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/inf.v0"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// Request is a pod's GPU request, parsed once in PreFilter.
type Request struct {
	placement.Request
	// NodePolicy orders nodes: binpack or spread.
	NodePolicy string
	// Devices counts the requested devices over all containers.
	Devices int
	// MaxMemoryMiB is the largest explicit per-device memory asked for, by MaxMemoryContainer.
	MaxMemoryMiB       int
	MaxMemoryContainer string
}

// Bounds on a pod's request. Filter compares the request with every GPU of every node in
// each cycle and PreFilter keys the fit cache by it, so no pod may make either costly; each
// bound is far above any real request.
const (
	// maxDevices bounds the count resource per container and per pod.
	maxDevices = api.MaxDevicesPerPod
	// maxMemoryMiB bounds the memory resource per device: 16 TiB, far above any GPU's memory,
	// keeps arithmetic on it far from overflowing.
	maxMemoryMiB = 1 << 24
	// maxTypes bounds each GPU type list: a cluster has few GPU types.
	maxTypes = 64
	// maxUUIDs bounds each GPU UUID list: every GPU of 128 eight-GPU nodes.
	maxUUIDs = 1024
	// maxEntryBytes bounds one type or UUID: NVML's names and UUIDs fit 96-byte buffers, so a
	// longer entry could never match.
	maxEntryBytes = 128
	// maxListBytes bounds a list annotation before it is split; maxUUIDs UUIDs of 40 bytes
	// with ", " between them fit.
	maxListBytes = 64 << 10
)

// CheckLargest refuses a request whose explicit memory per device is more than the largest
// device of its mode any node offers (largest MiB), naming the container and memoryResource.
func (r *Request) CheckLargest(largest int, memoryResource string) error {
	if r.MaxMemoryMiB <= largest {
		return nil
	}
	return fmt.Errorf("container %q asks for %s %d (MiB per GPU device); the largest device any node offers has %d MiB",
		r.MaxMemoryContainer, memoryResource, r.MaxMemoryMiB, largest)
}

// Parse reads the pod's GPU request. It returns nil, nil for a pod that asks for no GPU.
// Every error names the container (or annotation) and the value.
//
// GPUs go to regular containers and sidecars (init containers with restartPolicy: Always)
// only: a plain init container asking for any GPU resource is an error. The device plugin
// finds the container of each device in the kubelet's PodResources API, which does not list
// plain init containers, and the kubelet reuses their device IDs for the app containers.
func Parse(pod *v1.Pod, names config.ResourceNames, defaultNodePolicy string) (*Request, error) {
	req := &Request{NodePolicy: defaultNodePolicy}
	var errs []error
	containers := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range containers {
		c := &containers[i]
		count, err := quantity(c, names.ResourceCountName)
		errs = append(errs, err)
		mem, err := quantity(c, names.ResourceMemoryName)
		errs = append(errs, err)
		pct, err := quantity(c, names.ResourceMemoryPercentageName)
		errs = append(errs, err)
		cores, err := quantity(c, names.ResourceCoreName)
		errs = append(errs, err)
		if i < len(pod.Spec.InitContainers) && !sidecar(c) {
			if asked := askedFor(names, count, mem, pct, cores); len(asked) > 0 {
				errs = append(errs, fmt.Errorf("init container %q requests %s: dynamig gives GPUs to regular containers and sidecars (init containers with restartPolicy: Always) only; move the GPU request to a sidecar or the main container",
					c.Name, strings.Join(asked, " and ")))
			}
			continue
		}
		if count == 0 {
			if mem > 0 || pct > 0 || cores > 0 {
				errs = append(errs, fmt.Errorf("container %q asks for %s without %s: kubelet gives devices only through %s, add %s: 1",
					c.Name, strings.Join(askedFor(names, 0, mem, pct, cores), " and "), names.ResourceCountName, names.ResourceCountName, names.ResourceCountName))
			}
			continue
		}
		bad := len(errs)
		if count > maxDevices {
			errs = append(errs, fmt.Errorf("container %q: %s is %d; at most %d (a pod's devices are on one node)", c.Name, names.ResourceCountName, count, maxDevices))
		}
		if mem > maxMemoryMiB {
			errs = append(errs, fmt.Errorf("container %q: %s is %d; at most %d (MiB per device, 16 TiB)", c.Name, names.ResourceMemoryName, mem, maxMemoryMiB))
		}
		if pct > 100 {
			errs = append(errs, fmt.Errorf("container %q: %s is %d; it is a percentage of one device, at most 100", c.Name, names.ResourceMemoryPercentageName, pct))
		}
		if cores > 100 {
			errs = append(errs, fmt.Errorf("container %q: %s is %d; it is a percentage of one device, at most 100", c.Name, names.ResourceCoreName, cores))
		}
		if len(errs) > bad {
			continue
		}
		req.Containers = append(req.Containers, placement.ContainerRequest{
			Index: i, Devices: int(count), MemoryMiB: int(mem), MemoryPercent: int(pct), Cores: int(cores),
		})
		// count <= maxDevices: the sum cannot wrap.
		req.Devices += int(count)
		if int(mem) > req.MaxMemoryMiB {
			req.MaxMemoryMiB, req.MaxMemoryContainer = int(mem), c.Name
		}
	}
	if req.Devices > maxDevices {
		errs = append(errs, fmt.Errorf("containers ask for %d %s in all; at most %d per pod (a pod's devices are on one node)", req.Devices, names.ResourceCountName, maxDevices))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if req.Devices == 0 {
		return nil, nil
	}
	errs = append(errs, req.parseAnnotations(pod.Annotations)...)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return req, nil
}

func (req *Request) parseAnnotations(a map[string]string) []error {
	var errs []error
	switch mode := a[api.VGPUModeAnnotation]; mode {
	case "", api.ModeMIG, api.ModeHAMiCore:
		req.Mode = mode
	default:
		errs = append(errs, fmt.Errorf("annotation %s is %q; want %q, %q or none (either)", api.VGPUModeAnnotation, mode, api.ModeMIG, api.ModeHAMiCore))
	}
	// Normalised here once, as placement.Request documents, not on every GPU of every node.
	for _, sel := range []struct {
		key        string
		into       *[]string
		maxEntries int
		uuids      bool
	}{
		{api.UseGPUTypeAnnotation, &req.UseTypes, maxTypes, false},
		{api.NoUseGPUTypeAnnotation, &req.NoUseTypes, maxTypes, false},
		{api.UseGPUUUIDAnnotation, &req.UseUUIDs, maxUUIDs, true},
		{api.NoUseGPUUUIDAnnotation, &req.NoUseUUIDs, maxUUIDs, true},
	} {
		entries, err := list(sel.key, a[sel.key], sel.maxEntries, !sel.uuids)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if sel.uuids {
			// Exact, and binary-searched.
			slices.Sort(entries)
			entries = slices.Compact(entries)
		}
		*sel.into = entries
	}
	policy := func(key string, into *string) {
		switch v := a[key]; v {
		case "":
		case api.PolicyBinpack, api.PolicySpread:
			*into = v
		default:
			errs = append(errs, fmt.Errorf("annotation %s is %q; want %q or %q", key, v, api.PolicyBinpack, api.PolicySpread))
		}
	}
	policy(api.NodeSchedulerPolicyAnnotation, &req.NodePolicy)
	policy(api.GPUSchedulerPolicyAnnotation, &req.GPUPolicy)
	// HAMi reads it with strconv.ParseBool and takes anything else as false; a value that is
	// no boolean is refused here rather than silently not binding.
	if v, ok := a[api.NUMABindAnnotation]; ok {
		bind, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("annotation %s is %q; want true or false", api.NUMABindAnnotation, v))
		}
		req.NUMABind = bind
	}
	return errs
}

// quantity reads an extended resource of a container: its limit, else its request. It must
// be a non-negative whole number.
func quantity(c *v1.Container, name string) (int64, error) {
	q, ok := c.Resources.Limits[v1.ResourceName(name)]
	if !ok {
		q, ok = c.Resources.Requests[v1.ResourceName(name)]
	}
	if !ok {
		return 0, nil
	}
	v, exact := asWhole(q)
	if !exact || v < 0 {
		return 0, fmt.Errorf("container %q: %s is %s; want a non-negative whole number", c.Name, name, q.String())
	}
	return v, nil
}

// asWhole returns q as an int64 when it is a whole number that fits one. MilliValue and Value
// saturate or wrap beyond int64 (1e100 reads as 0), so they cannot tell.
func asWhole(q resource.Quantity) (int64, bool) {
	if v, ok := q.AsInt64(); ok {
		return v, true
	}
	// 1000m, 1.5e3 and values held as inf.Dec: exactly, through inf.Dec.
	d := q.AsDec()
	if d.Sign() == 0 {
		return 0, true
	}
	// |unscaled| >= 1, so a value with more than 18 trailing zeros exceeds int64; rescaling it
	// would cost time in the exponent.
	if d.Scale() < -18 {
		return 0, false
	}
	whole := new(inf.Dec).Round(d, 0, inf.RoundDown)
	if whole.Cmp(d) != 0 || !whole.UnscaledBig().IsInt64() {
		return 0, false
	}
	return whole.UnscaledBig().Int64(), true
}

// sidecar reports whether an init container is a sidecar: restartable, it runs beside the
// app containers.
func sidecar(c *v1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
}

// askedFor names the GPU resources a container asks for.
func askedFor(names config.ResourceNames, count, mem, pct, cores int64) []string {
	var out []string
	if count > 0 {
		out = append(out, names.ResourceCountName)
	}
	if mem > 0 {
		out = append(out, names.ResourceMemoryName)
	}
	if pct > 0 {
		out = append(out, names.ResourceMemoryPercentageName)
	}
	if cores > 0 {
		out = append(out, names.ResourceCoreName)
	}
	return out
}

// list reads the comma-separated annotation key, whose value is s: its trimmed, non-empty
// entries, valid UTF-8, lowercased when lower, at most maxEntries of them and
// maxEntryBytes each.
func list(key, s string, maxEntries int, lower bool) ([]string, error) {
	if len(s) > maxListBytes {
		return nil, fmt.Errorf("annotation %s is %d bytes, at most %d", key, len(s), maxListBytes)
	}
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		if !utf8.ValidString(part) {
			return nil, fmt.Errorf("annotation %s: entry %d (%.16q…) is not valid UTF-8", key, len(out)+1, part)
		}
		if lower {
			// GPU types match case-insensitively. Lowercasing can lengthen an
			// entry, so the bound below is on what is kept.
			part = strings.ToLower(part)
		}
		if len(part) > maxEntryBytes {
			return nil, fmt.Errorf("annotation %s: entry %d (%.16q…) is %d bytes, at most %d", key, len(out)+1, part, len(part), maxEntryBytes)
		}
		out = append(out, part)
	}
	if len(out) > maxEntries {
		return nil, fmt.Errorf("annotation %s: %d entries, at most %d", key, len(out), maxEntries)
	}
	return out, nil
}

// ContainerIndex is the named container's index in the numbering of requests and
// reservations: init containers first, then the regular ones.
func ContainerIndex(p *v1.Pod, name string) (int, bool) {
	for i, c := range p.Spec.InitContainers {
		if c.Name == name {
			return i, true
		}
	}
	for i, c := range p.Spec.Containers {
		if c.Name == name {
			return len(p.Spec.InitContainers) + i, true
		}
	}
	return 0, false
}

// Relocatable says whether q may be moved (evicted, its controller making it again) to make
// room for the pending pod, by what the pods themselves say: q is annotated
// dynamig.io/relocatable "true", owned by a controller, bound and not ending, and of
// priority no higher than the pending pod's. Disruption budgets, the relocation
// interval and whether q fits elsewhere are the scheduler's to check.
func Relocatable(q, pending *v1.Pod) bool {
	return q.Annotations[api.RelocatableAnnotation] == "true" && metav1.GetControllerOf(q) != nil &&
		q.Spec.NodeName != "" && q.DeletionTimestamp == nil && q.Status.Phase != v1.PodSucceeded && q.Status.Phase != v1.PodFailed &&
		corev1helpers.PodPriority(q) <= corev1helpers.PodPriority(pending)
}
