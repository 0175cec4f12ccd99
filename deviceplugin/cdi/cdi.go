// Package cdi names dynamig's CDI devices and writes their specs. The device plugin answers
// Allocate with CDI names (QualifiedName) and writes each device's spec (what the container
// gets: its MIG device, or its hami-core share) before the container is created; the
// runtime resolves the names against the spec directory. One spec file per device, written
// with the CDI library (temp file and rename, so a runtime never reads half a spec).
package cdi

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// dynamig's CDI vendor and class: dynamig.io/gpu=<device>.
const (
	Vendor = "dynamig.io"
	Class  = "gpu"
	// DefaultSpecDir is the runtimes' volatile CDI directory: a reboot leaves no spec behind.
	DefaultSpecDir = "/var/run/cdi"
)

// DeviceName is the CDI device name of one of node's device IDs: the two joined, every
// character a CDI name does not allow replaced by '-'. Stable across restarts, as the device
// IDs are.
func DeviceName(node, deviceID string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == ':', r == '-':
			return r
		}
		return '-'
	}, node+"_"+deviceID)
}

// QualifiedName is the name Allocate answers for one of node's device IDs:
// dynamig.io/gpu=<DeviceName>.
func QualifiedName(node, deviceID string) string {
	return parser.QualifiedName(Vendor, Class, DeviceName(node, deviceID))
}

// Specs writes and removes device specs in one directory.
type Specs struct {
	dir   string
	cache *cdi.Cache
}

// New writes specs into dir (created when missing).
func New(dir string) (*Specs, error) {
	c, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI spec directory %s: %w", dir, err)
	}
	return &Specs{dir: dir, cache: c}, nil
}

// Write replaces the spec of node's device ID: a container naming QualifiedName(node, id)
// gets edits.
func (s *Specs) Write(node, deviceID string, edits specs.ContainerEdits) error {
	name := DeviceName(node, deviceID)
	spec := &specs.Spec{Kind: Vendor + "/" + Class, Devices: []specs.Device{{Name: name, ContainerEdits: edits}}}
	version, err := cdi.MinimumRequiredVersion(spec)
	if err != nil {
		return fmt.Errorf("CDI spec of %s: %w", name, err)
	}
	spec.Version = version
	if err := s.cache.WriteSpec(spec, s.fileName(name)); err != nil {
		return fmt.Errorf("writing the CDI spec of %s in %s: %w", name, s.dir, err)
	}
	return nil
}

// Remove removes the spec of node's device ID; a missing one is not an error.
func (s *Specs) Remove(node, deviceID string) error {
	if err := s.cache.RemoveSpec(s.fileName(DeviceName(node, deviceID))); err != nil {
		return fmt.Errorf("removing the CDI spec of %s from %s: %w", DeviceName(node, deviceID), s.dir, err)
	}
	return nil
}

// RemoveExcept removes the specs of node's device IDs that keep does not hold, and returns
// how many it removed. The spec directory may be shared (by other vendors, or by nodes of
// a test on one host): only dynamig's specs of this node are looked at.
func (s *Specs) RemoveExcept(node string, keep map[string]bool) (int, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("listing the CDI specs in %s: %w", s.dir, err)
	}
	kept := map[string]bool{}
	for id := range keep {
		kept[s.fileName(DeviceName(node, id))] = true
	}
	prefix := s.fileName(DeviceName(node, ""))
	prefix = strings.TrimSuffix(prefix, ".yaml")
	removed := 0
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, ".yaml") || kept[name] {
			continue
		}
		if err := s.cache.RemoveSpec(name); err != nil {
			return removed, fmt.Errorf("removing the CDI spec %s from %s: %w", name, s.dir, err)
		}
		removed++
	}
	return removed, nil
}

// FileName is the name of the spec file of node's device ID in the spec directory.
func (s *Specs) FileName(node, deviceID string) string { return s.fileName(DeviceName(node, deviceID)) }

// fileName is the device's spec file, in the CDI library's naming of per-device specs.
func (s *Specs) fileName(device string) string {
	return cdi.GenerateTransientSpecName(Vendor, Class, device) + ".yaml"
}

// Edits are the CDI container edits that give a container what an Allocate answer would:
// its environment (sorted, so equal answers write equal specs), bind mounts (read-only where
// the answer says so) and device nodes. The hand-off writes them as the device's spec.
func Edits(resp *pluginapi.ContainerAllocateResponse) specs.ContainerEdits {
	var e specs.ContainerEdits
	for _, k := range slices.Sorted(maps.Keys(resp.GetEnvs())) {
		e.Env = append(e.Env, k+"="+resp.GetEnvs()[k])
	}
	for _, m := range resp.GetMounts() {
		opts := []string{"bind", "rw"}
		if m.GetReadOnly() {
			opts = []string{"bind", "ro"}
		}
		e.Mounts = append(e.Mounts, &specs.Mount{HostPath: m.GetHostPath(), ContainerPath: m.GetContainerPath(), Options: opts})
	}
	for _, d := range resp.GetDevices() {
		e.DeviceNodes = append(e.DeviceNodes, &specs.DeviceNode{HostPath: d.GetHostPath(), Path: d.GetContainerPath(), Permissions: d.GetPermissions()})
	}
	return e
}
