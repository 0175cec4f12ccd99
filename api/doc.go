// Package api holds dynamig's wire contract with HAMi v2.10: annotation keys, resource names,
// and the JSON types of the node inventory (hami.io/node-nvidia-register) and of the pod MIG
// reservations (hami.io/vgpu-mig-allocations), with their decoders and validation.
//
// Decoders never panic; every error names the field path and the offending value, in the
// k8s.io/apimachinery field-error format, so a refusal can be shown to a user as it is.
package api
