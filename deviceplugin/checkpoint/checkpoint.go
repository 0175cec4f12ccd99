// Package checkpoint is the device plugin's local record of the MIG instances it makes: the
// intent is written before each create and the result after, so that after a crash the
// plugin knows which instances are its own and which creates were left half done.
// Ownership is keyed by pod UID, containerIndex and deviceIndex, never by placement alone:
// a placement outlives one pod and serves the next.
package checkpoint

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/dynamig/dynamig/api"
)

// Version is the file format's version.
const Version = 1

// State of an entry.
type State string

const (
	// Intent: a create is about to start; if the plugin died, the instance may or may not
	// exist.
	Intent State = "intent"
	// Created: the GI and CI exist with the recorded ids.
	Created State = "created"
)

// Key identifies one requested device of one pod.
type Key struct {
	PodUID         string `json:"podUID"`
	ContainerIndex int    `json:"containerIndex"`
	DeviceIndex    int    `json:"deviceIndex"`
}

// Entry is one instance the plugin made or is making.
type Entry struct {
	Key
	PodNamespace string        `json:"podNamespace"`
	PodName      string        `json:"podName"`
	GPUUUID      string        `json:"gpuUUID"`
	Profile      string        `json:"profile"`
	Placement    api.Placement `json:"placement"`
	State        State         `json:"state"`
	// Set once Created.
	GPUInstanceID     int    `json:"gpuInstanceID,omitempty"`
	ComputeInstanceID int    `json:"computeInstanceID,omitempty"`
	MigUUID           string `json:"migUUID,omitempty"`
}

type file struct {
	Version int     `json:"version"`
	Entries []Entry `json:"entries"`
}

// Checkpoint is the file and its in-memory copy; every change is written through before
// the call returns.
type Checkpoint struct {
	path string

	mu      sync.Mutex
	entries map[Key]Entry
}

// Open loads the checkpoint at path, or starts an empty one if there is no file. A file
// that cannot be read is an error: without it the plugin cannot tell its instances from
// others, and must not guess.
func Open(path string) (*Checkpoint, error) {
	c := &Checkpoint{path: path, entries: map[Key]Entry{}}
	data, err := os.ReadFile(path)
	switch {
	case os.IsNotExist(err):
		return c, nil
	case err != nil:
		return nil, fmt.Errorf("reading checkpoint %s: %w", path, err)
	}
	entries, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	for _, e := range entries {
		c.entries[e.Key] = e
	}
	return c, nil
}

// Decode parses a checkpoint file and validates every entry; errors name the entry and field.
func Decode(data []byte) ([]Entry, error) {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a checkpoint: %w", err)
	}
	if f.Version != Version {
		return nil, fmt.Errorf("version is %d; this plugin reads version %d", f.Version, Version)
	}
	seen := map[Key]bool{}
	for i, e := range f.Entries {
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("entries[%d]: %w", i, err)
		}
		if seen[e.Key] {
			return nil, fmt.Errorf("entries[%d]: duplicate pod %s container %d device %d", i, e.PodUID, e.ContainerIndex, e.DeviceIndex)
		}
		seen[e.Key] = true
	}
	return f.Entries, nil
}

func (e *Entry) validate() error {
	switch {
	case e.PodUID == "":
		return fmt.Errorf("podUID: required")
	case e.ContainerIndex < 0 || e.DeviceIndex < 0:
		return fmt.Errorf("containerIndex %d, deviceIndex %d: must not be negative", e.ContainerIndex, e.DeviceIndex)
	case e.GPUUUID == "":
		return fmt.Errorf("gpuUUID: required")
	case e.Placement.Start < 0 || e.Placement.Size <= 0:
		return fmt.Errorf("placement %s: invalid", e.Placement)
	}
	if _, err := api.ParseProfileName(e.Profile); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	switch e.State {
	case Intent:
	case Created:
		if e.MigUUID == "" {
			return fmt.Errorf("state created without migUUID")
		}
	default:
		return fmt.Errorf("state %q: want %q or %q", e.State, Intent, Created)
	}
	return nil
}

// Path is the checkpoint's file.
func (c *Checkpoint) Path() string { return c.path }

// Put records an entry (an intent or a result) and writes the file.
func (c *Checkpoint) Put(e Entry) error {
	if err := e.validate(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, had := c.entries[e.Key]
	c.entries[e.Key] = e
	if err := c.writeLocked(); err != nil {
		if had {
			c.entries[e.Key] = old
		} else {
			delete(c.entries, e.Key)
		}
		return err
	}
	return nil
}

// Remove forgets an entry and writes the file.
func (c *Checkpoint) Remove(k Key) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, had := c.entries[k]
	if !had {
		return nil
	}
	delete(c.entries, k)
	if err := c.writeLocked(); err != nil {
		c.entries[k] = old
		return err
	}
	return nil
}

// Get returns an entry.
func (c *Checkpoint) Get(k Key) (Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	return e, ok
}

// Entries lists every entry, sorted by pod UID, containerIndex, deviceIndex.
func (c *Checkpoint) Entries() []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Entry, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.PodUID, b.PodUID), cmp.Compare(a.ContainerIndex, b.ContainerIndex), cmp.Compare(a.DeviceIndex, b.DeviceIndex))
	})
	return out
}

// writeLocked replaces the file atomically: a temp file in the same directory, synced, then
// renamed over the old one, so a crash leaves the old or the new file, never a torn one. Its
// error names the checkpoint, which callers refuse or roll back a create on.
func (c *Checkpoint) writeLocked() error {
	if err := c.replace(); err != nil {
		return fmt.Errorf("writing checkpoint %s: %w", c.path, err)
	}
	return nil
}

func (c *Checkpoint) replace() error {
	f := file{Version: Version, Entries: make([]Entry, 0, len(c.entries))}
	for _, e := range c.entries {
		f.Entries = append(f.Entries, e)
	}
	slices.SortFunc(f.Entries, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.PodUID, b.PodUID), cmp.Compare(a.ContainerIndex, b.ContainerIndex), cmp.Compare(a.DeviceIndex, b.DeviceIndex))
	})
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), ".dynamig-checkpoint-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), c.path)
}
