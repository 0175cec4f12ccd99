// Package mutation decides what dynamig's admission webhook changes in a pod being created,
// from the pod's JSON alone. It links no admission framework (package webhook serves it), so
// its fuzz target, fed the bytes any client of the webhook's Service can send, builds on little
// more than the pod's types.
package mutation

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	v1 "k8s.io/api/core/v1"
)

// SchedulerNameSetter sets the scheduler of GPU pods that name none, and, as HAMi's webhook
// does, the device count of their containers that ask for GPU memory or cores without one.
type SchedulerNameSetter struct {
	// Resource is the GPU count resource, the device config's resourceCountName.
	Resource v1.ResourceName
	// Shares are the device config's memory, memory percentage and cores resources: a
	// container that names one in its limits and no Resource is given DefaultGPUNum devices.
	Shares []v1.ResourceName
	// DefaultGPUNum is the device config's defaultGPUNum (HAMi's key and default, 1); 0 gives
	// no count, and such a container is no GPU request.
	DefaultGPUNum int
	// SchedulerName is what the pods get: dynamig-scheduler.
	SchedulerName string
	// Replace lists the scheduler names that count as naming none, besides the empty one
	// (the API server has defaulted an empty one to default-scheduler before mutating
	// admission, so default-scheduler belongs here).
	Replace []string
}

// Decision is the answer for one pod.
type Decision struct {
	// Patches change the pod; none when it is allowed unchanged.
	Patches []jsonpatch.Operation
	// Reason says why, for the admission response.
	Reason string
	// Pod is the pod's name, or its generateName before the API server names it; From is the
	// schedulerName it came with.
	Pod, From string
}

// Decide reads a pod's JSON: a pod that asks for the count resource, or whose containers
// ask for GPU memory or cores without it (given DefaultGPUNum devices each, as HAMi's webhook
// gives them), and names no scheduler gets a patch of /spec/schedulerName; one that names
// SchedulerName gets only the counts; any other pod nothing. An error means the bytes are
// not a pod.
func (s *SchedulerNameSetter) Decide(raw []byte) (Decision, error) {
	pod := &admittedPod{}
	if err := json.Unmarshal(raw, pod); err != nil {
		return Decision{}, fmt.Errorf("decoding the pod: %w", err)
	}
	d := Decision{Pod: pod.name(), From: pod.Spec.SchedulerName}
	counted := s.countless(pod)
	switch {
	case !s.asksForGPU(pod) && len(counted) == 0:
		d.Reason = "the pod asks for no " + string(s.Resource)
		return d, nil
	case s.namesNoScheduler(pod):
		d.Reason = "schedulerName set to " + s.SchedulerName
		// "add" replaces an existing member (RFC 6902), so one operation serves a pod with or
		// without the field.
		d.Patches = []jsonpatch.Operation{jsonpatch.NewOperation("add", "/spec/schedulerName", s.SchedulerName)}
	case pod.Spec.SchedulerName == s.SchedulerName && len(counted) > 0:
		d.Reason = "the pod names schedulerName " + s.SchedulerName
	default:
		// Another scheduler's pod: its containers are none of dynamig's business.
		d.Reason = "the pod names schedulerName " + pod.Spec.SchedulerName
		return d, nil
	}
	var names []string
	for _, i := range counted {
		c := &pod.Spec.Containers[i]
		names = append(names, c.Name)
		count := fmt.Sprint(s.DefaultGPUNum)
		d.Patches = append(d.Patches, jsonpatch.NewOperation("add", fmt.Sprintf("/spec/containers/%d/resources/limits/%s", i, escape(s.Resource)), count))
		// The API server has defaulted the requests from the limits before admission; an
		// extended resource's request must equal its limit.
		if c.Resources.Requests != nil {
			d.Patches = append(d.Patches, jsonpatch.NewOperation("add", fmt.Sprintf("/spec/containers/%d/resources/requests/%s", i, escape(s.Resource)), count))
		}
	}
	if len(names) > 0 {
		d.Reason += fmt.Sprintf("; %s: %d set on container(s) %s, which ask for GPU memory or cores without it (defaultGPUNum)", s.Resource, s.DefaultGPUNum, strings.Join(names, ", "))
	}
	return d, nil
}

// countless are the indexes of the regular containers that name one of Shares in their
// limits and Resource nowhere, when DefaultGPUNum gives them a count: HAMi's webhook reads
// the limits of regular containers only, and so does this one.
func (s *SchedulerNameSetter) countless(pod *admittedPod) []int {
	if s.DefaultGPUNum <= 0 {
		return nil
	}
	var out []int
	for i, c := range pod.Spec.Containers {
		if s.containerAsks(c) {
			continue
		}
		if slices.ContainsFunc(s.Shares, func(r v1.ResourceName) bool { _, ok := c.Resources.Limits[r]; return ok }) {
			out = append(out, i)
		}
	}
	return out
}

// escape makes a resource name one JSON Pointer token (RFC 6901): nvidia.com~1gpu.
func escape(r v1.ResourceName) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(string(r))
}

// admittedPod is the part of a pod the webhook reads. Resource quantities stay undecoded:
// only their names matter here, and parsing a hostile quantity costs time that grows with
// its exponent (1e-99999999 takes hours), which anyone who can reach the Service could send.
type admittedPod struct {
	Metadata struct {
		Name         string `json:"name"`
		GenerateName string `json:"generateName"`
	} `json:"metadata"`
	Spec struct {
		SchedulerName  string              `json:"schedulerName"`
		InitContainers []admittedContainer `json:"initContainers"`
		Containers     []admittedContainer `json:"containers"`
	} `json:"spec"`
}

type admittedContainer struct {
	Name      string `json:"name"`
	Resources struct {
		Limits   map[v1.ResourceName]json.RawMessage `json:"limits"`
		Requests map[v1.ResourceName]json.RawMessage `json:"requests"`
	} `json:"resources"`
}

// asksForGPU reports whether any container or init container names the GPU count resource
// in its limits or requests, as the validating policy's match condition does.
func (s *SchedulerNameSetter) asksForGPU(pod *admittedPod) bool {
	return slices.ContainsFunc(pod.Spec.InitContainers, s.containerAsks) || slices.ContainsFunc(pod.Spec.Containers, s.containerAsks)
}

func (s *SchedulerNameSetter) containerAsks(c admittedContainer) bool {
	_, inLimits := c.Resources.Limits[s.Resource]
	_, inRequests := c.Resources.Requests[s.Resource]
	return inLimits || inRequests
}

// namesNoScheduler reports whether the pod's schedulerName is empty or one of Replace.
func (s *SchedulerNameSetter) namesNoScheduler(pod *admittedPod) bool {
	return pod.Spec.SchedulerName == "" || slices.Contains(s.Replace, pod.Spec.SchedulerName)
}

// name is the pod's name, or its generateName prefix before the API server names it.
func (p *admittedPod) name() string {
	if p.Metadata.Name != "" {
		return p.Metadata.Name
	}
	return p.Metadata.GenerateName
}
