package allocate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/cdi"
)

// HAMiCoreOptions say where HAMi-core's library lives on the host and how its limits are
// set, from the device config (HAMi's keys).
type HAMiCoreOptions struct {
	// HostDir holds libvgpu.so and ld.so.preload (HAMi's default /usr/local/vgpu).
	HostDir string
	// LockDir is the host directory HAMi-core's processes of all containers of the node
	// share their lock files in, mounted at /tmp/vgpulock as HAMi mounts it; "" mounts none.
	LockDir string
	// MemoryScaling above 1 lets shares oversubscribe memory (CUDA_OVERSUBSCRIBE).
	MemoryScaling float64
	// CorePolicy is gpuCorePolicy (force or disable; default sets nothing), given to the
	// library as GPU_CORE_UTILIZATION_POLICY.
	CorePolicy string
	// LogLevel is libCudaLogLevel, given as LIBCUDA_LOG_LEVEL; 0 leaves the library's own.
	LogLevel int
	// Priority is the resource whose limit is a container's HAMi-core task priority
	// (resourcePriorityName, nvidia.com/priority), given as CUDA_TASK_PRIORITY.
	Priority v1.ResourceName
}

const (
	// hamiCoreContainerDir is where the library is mounted in the container, as HAMi does.
	hamiCoreContainerDir = "/usr/local/vgpu"
	// hamiCoreLockDir is where HAMi-core looks for its lock files.
	hamiCoreLockDir = "/tmp/vgpulock"
	// disableControl, set true in a container's own environment, keeps HAMi-core's library
	// out of it (no /etc/ld.so.preload), as HAMi's device plugin does.
	disableControl = "CUDA_DISABLE_CONTROL"
)

// preStartHAMiCore gives the container its hami-core shares: the GPUs (what DeviceEdits
// gives for their UUIDs) and HAMi-core's library and limits, from its segment of the
// signed hami.io/vgpu-devices-allocated. As HAMi's device plugin does, it then empties the
// container's segment of hami.io/vgpu-devices-to-allocate, and sets bind-phase success when
// every segment is empty; a restart of the container writes nothing. The shares are c.shares.
func (a *Allocator) preStartHAMiCore(ctx context.Context, c *container, idx int, ids []string) (specs.ContainerEdits, error) {
	pod := c.pod
	assigned, err := api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, pod.Annotations[api.DevicesAllocatedAnnotation])
	if err != nil {
		return specs.ContainerEdits{}, never(reasonTampered, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	var devs []api.HAMiCoreDevice
	if idx < len(assigned) {
		devs = assigned[idx]
	}
	if len(devs) != len(ids) {
		return specs.ContainerEdits{}, never(reasonAttribution, fmt.Errorf("pod %s/%s container %d has %d hami-core shares but the kubelet gave it %d devices", pod.Namespace, pod.Name, idx, len(devs), len(ids)))
	}
	uuids := make([]string, len(devs))
	for i, d := range devs {
		uuids[i] = d.UUID
	}
	gpus, err := a.opts.DeviceEdits.Edits(uuids)
	if err != nil {
		return specs.ContainerEdits{}, because(reasonSpec, err)
	}
	for attempt := 0; attempt < 5; attempt++ {
		pending, err := api.DecodeHAMiCoreDevices(api.DevicesToAllocateAnnotation, pod.Annotations[api.DevicesToAllocateAnnotation])
		if err != nil {
			pending = nil // consumed by another writer, or absent: nothing left to consume
		}
		annotations := map[string]string{}
		if idx < len(pending) && len(pending[idx]) > 0 {
			pending[idx] = nil
			annotations[api.DevicesToAllocateAnnotation] = api.EncodeHAMiCoreDevices(pending)
		}
		done := true
		for _, seg := range pending {
			done = done && len(seg) == 0
		}
		if done && pod.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
			annotations[api.BindPhaseAnnotation] = api.BindPhaseSuccess
		}
		if len(annotations) == 0 {
			break
		}
		if pod, err = a.patchAnnotations(ctx, pod, annotations); err == nil {
			break
		} else if !errors.Is(err, errPodChanged) || attempt == 4 {
			return specs.ContainerEdits{}, because(reasonWriteBack, fmt.Errorf("consuming the hami-core assignment of pod %s/%s: %w", pod.Namespace, pod.Name, err))
		}
	}
	c.shares = devs
	// What the GPUs need, then HAMi-core's library and limits.
	return cdi.Merge(gpus, cdi.Edits(a.hamiCoreResponse(pod, idx, devs))), nil
}

// hamiCoreResponse is HAMi-core's contract with its library (the GPUs themselves, and
// NVIDIA_VISIBLE_DEVICES, come from DeviceEdits), as HAMi v2.10's device plugin and webhook
// give it: per device its memory limit, one SM limit, a shared cache file, the node's lock
// directory, the task priority, core policy and log level, and the library preloaded through
// mounts unless the container sets CUDA_DISABLE_CONTROL=true.
func (a *Allocator) hamiCoreResponse(pod *v1.Pod, container int, devs []api.HAMiCoreDevice) *pluginapi.ContainerAllocateResponse {
	opts := a.opts.HAMiCore
	hostDir := a.opts.HAMiCore.HostDir
	if hostDir == "" {
		hostDir = hamiCoreContainerDir
	}
	env := map[string]string{}
	for i, d := range devs {
		env[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)] = fmt.Sprintf("%dm", d.MemoryMiB)
	}
	env["CUDA_DEVICE_SM_LIMIT"] = fmt.Sprint(devs[0].Cores)
	cache := fmt.Sprintf("%s/%s_%d.cache", hamiCoreContainerDir, pod.UID, container)
	env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = cache
	if opts.MemoryScaling > 1 {
		env["CUDA_OVERSUBSCRIBE"] = "true"
	}
	if opts.CorePolicy != "" && opts.CorePolicy != "default" {
		env["GPU_CORE_UTILIZATION_POLICY"] = opts.CorePolicy
	}
	if opts.LogLevel > 0 {
		env["LIBCUDA_LOG_LEVEL"] = fmt.Sprint(opts.LogLevel)
	}
	spec := specOf(pod, container)
	if q, ok := spec.Resources.Limits[opts.Priority]; ok && opts.Priority != "" {
		env["CUDA_TASK_PRIORITY"] = fmt.Sprint(q.Value())
	}
	mounts := []*pluginapi.Mount{
		{ContainerPath: filepath.Join(hamiCoreContainerDir, "libvgpu.so"), HostPath: filepath.Join(hostDir, "libvgpu.so"), ReadOnly: true},
		{ContainerPath: filepath.Dir(cache), HostPath: filepath.Join(hostDir, "containers", string(pod.UID)), ReadOnly: false},
	}
	if opts.LockDir != "" {
		mounts = append(mounts, &pluginapi.Mount{ContainerPath: hamiCoreLockDir, HostPath: opts.LockDir})
	}
	if !controlDisabled(spec) {
		mounts = append(mounts, &pluginapi.Mount{ContainerPath: "/etc/ld.so.preload", HostPath: filepath.Join(hostDir, "ld.so.preload"), ReadOnly: true})
	}
	return &pluginapi.ContainerAllocateResponse{Envs: env, Mounts: mounts}
}

// specOf is the pod's container at index (init containers first, as reservations count).
func specOf(pod *v1.Pod, index int) v1.Container {
	if index < len(pod.Spec.InitContainers) {
		return pod.Spec.InitContainers[index]
	}
	if i := index - len(pod.Spec.InitContainers); i < len(pod.Spec.Containers) {
		return pod.Spec.Containers[i]
	}
	return v1.Container{}
}

// controlDisabled reports whether the container sets CUDA_DISABLE_CONTROL to true in its own
// environment (a value that does not parse counts as false, as for HAMi).
func controlDisabled(c v1.Container) bool {
	for _, e := range c.Env {
		if e.Name == disableControl {
			if on, err := strconv.ParseBool(e.Value); err == nil && on {
				return true
			}
		}
	}
	return false
}
