package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// maxShownValue bounds how much of a bad value an error repeats.
const maxShownValue = 80

// decodeArray decodes a JSON array annotation element by element into out, so a type error
// names the element's index as well as the field inside it.
func decodeArray[T any](root *field.Path, raw string) ([]T, field.ErrorList) {
	if strings.TrimSpace(raw) == "" {
		return nil, field.ErrorList{field.Required(root, "annotation is empty; want a JSON array")}
	}
	var elems []json.RawMessage
	if err := json.Unmarshal([]byte(raw), &elems); err != nil {
		return nil, field.ErrorList{jsonError(root, raw, err)}
	}
	out := make([]T, len(elems))
	var errs field.ErrorList
	for i, elem := range elems {
		if err := json.Unmarshal(elem, &out[i]); err != nil {
			errs = append(errs, jsonError(root.Index(i), string(elem), err))
		}
	}
	return out, errs
}

// jsonError turns an encoding/json error into a field error that names the field path.
func jsonError(path *field.Path, raw string, err error) *field.Error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		p := path
		if typeErr.Field != "" {
			for _, name := range strings.Split(typeErr.Field, ".") {
				p = p.Child(name)
			}
		}
		return field.Invalid(p, typeErr.Value, fmt.Sprintf("must be a JSON %s", jsonKind(typeErr.Type.Kind().String())))
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return field.Invalid(path, shorten(raw), fmt.Sprintf("not valid JSON at byte %d: %v", syntaxErr.Offset, err))
	}
	return field.Invalid(path, shorten(raw), err.Error())
}

func jsonKind(goKind string) string {
	switch goKind {
	case "slice", "array":
		return "array"
	case "struct", "map":
		return "object"
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "integer in range"
	default:
		return "number"
	}
}

func shorten(s string) string {
	if len(s) <= maxShownValue {
		return s
	}
	return s[:maxShownValue] + "…"
}
