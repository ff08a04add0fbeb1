// Command oracle is the cel-go side of the differential test of the policy
// CEL environment (agent/policy/tests/cel_differential.rs).
//
// It builds the environment the reference implementation uses for
// RuntimePolicy expressions (pkg/compiler/env.go: the cel-go extension
// libraries plus the Kubernetes libraries from k8s.io/apiserver/pkg/cel/library,
// with json.unmarshal standing in for the Kyverno SDK library of that name),
// reads corpus files (YAML lists of cases), and prints one JSON object per case:
//
//	{"name":..., "type": "list(string)"}                 the checked output type, or
//	{"name":..., "check_error": "undeclared"}            the class of the type-check error
//
// plus, for a case that checks, "value" (canonical JSON, see encode) or
// "eval_error" (the class of the evaluation error). Classes rather than messages
// are compared because the two implementations word their errors differently.
//
//	oracle FILE...              golden output on stdout
//	oracle -bench N FILE...     ns per expression for compile and evaluate, as JSON
package main

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/ext"
	"k8s.io/apiserver/pkg/cel/library"
	"sigs.k8s.io/yaml"
)

// Var is a typed variable a case declares.
type Var struct {
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// Case is one corpus entry.
type Case struct {
	Name string         `json:"name"`
	Expr string         `json:"expr"`
	Vars map[string]Var `json:"vars,omitempty"`
}

// Result is one golden line.
type Result struct {
	Name       string          `json:"name"`
	Type       string          `json:"type,omitempty"`
	CheckError string          `json:"check_error,omitempty"`
	Value      json.RawMessage `json:"value,omitempty"`
	EvalError  string          `json:"eval_error,omitempty"`
	// Detail is the cel-go message, kept for a reader of the golden file and
	// never compared.
	Detail string `json:"detail,omitempty"`
}

func baseOptions() []cel.EnvOption {
	return []cel.EnvOption{
		ext.Bindings(), ext.Encoders(), ext.Lists(), ext.Math(), ext.Protos(), ext.Sets(), ext.Strings(),
		library.CIDR(), library.Format(), library.IP(), library.Lists(), library.Regex(),
		library.URLs(), library.Quantity(), library.SemverLib(),
		// The Kyverno SDK's json.unmarshal: encoding/json into any, adapted as
		// cel-go adapts any native value.
		cel.Function("json.unmarshal",
			cel.Overload("json_unmarshal_string", []*cel.Type{cel.StringType}, cel.DynType,
				cel.UnaryBinding(func(v ref.Val) ref.Val {
					var out any
					if err := json.Unmarshal([]byte(v.(types.String)), &out); err != nil {
						return types.NewErr("json.unmarshal: %v", err)
					}
					return types.DefaultTypeAdapter.NativeToValue(out)
				}))),
	}
}

func main() {
	bench := flag.Int("bench", 0, "iterations of the benchmark mode (0: print the golden output)")
	flag.Parse()
	var cases []Case
	for _, path := range flag.Args() {
		raw, err := os.ReadFile(path)
		if err != nil {
			fatal(err)
		}
		var cs []Case
		if err := yaml.Unmarshal(raw, &cs); err != nil {
			fatal(fmt.Errorf("%s: %w", path, err))
		}
		cases = append(cases, cs...)
	}
	base, err := cel.NewEnv(baseOptions()...)
	if err != nil {
		fatal(err)
	}
	if *bench > 0 {
		runBench(base, cases, *bench)
		return
	}
	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false)
	for _, c := range cases {
		if err := out.Encode(run(base, c)); err != nil {
			fatal(err)
		}
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "oracle:", err)
	os.Exit(2)
}

// caseEnv extends the base environment with the case's variables and
// returns the activation holding their values.
func caseEnv(base *cel.Env, c Case) (*cel.Env, map[string]any, error) {
	names := make([]string, 0, len(c.Vars))
	for n := range c.Vars {
		names = append(names, n)
	}
	sort.Strings(names)
	var opts []cel.EnvOption
	act := map[string]any{}
	for _, n := range names {
		v := c.Vars[n]
		t, rest, err := parseType(v.Type)
		if err != nil || rest != "" {
			return nil, nil, fmt.Errorf("variable %s: bad type %q", n, v.Type)
		}
		opts = append(opts, cel.Variable(n, t))
		act[n] = native(t, v.Value)
	}
	if len(opts) == 0 {
		return base, act, nil
	}
	env, err := base.Extend(opts...)
	return env, act, err
}

func run(base *cel.Env, c Case) Result {
	r := Result{Name: c.Name}
	env, act, err := caseEnv(base, c)
	if err != nil {
		fatal(fmt.Errorf("case %s: %w", c.Name, err))
	}
	ast, iss := env.Compile(c.Expr)
	if iss.Err() != nil {
		r.CheckError = checkClass(iss.Err().Error())
		// What the parser itself refuses ("invalid int literal",
		// "unsupported syntax") is a syntax error whatever its wording.
		if _, piss := env.Parse(c.Expr); r.CheckError == "other" && piss.Err() != nil {
			r.CheckError = "syntax"
		}
		r.Detail = firstLine(iss.Err().Error())
		return r
	}
	r.Type = cel.FormatCELType(ast.OutputType())
	prg, err := env.Program(ast)
	if err != nil {
		r.EvalError = "program"
		r.Detail = err.Error()
		return r
	}
	val, _, err := prg.Eval(act)
	if err != nil {
		r.EvalError = evalClass(err.Error())
		r.Detail = firstLine(err.Error())
		return r
	}
	enc, err := json.Marshal(encode(val))
	if err != nil {
		fatal(err)
	}
	r.Value = enc
	return r
}

func firstLine(s string) string {
	s = strings.TrimPrefix(s, "ERROR: <input>:")
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// checkClass buckets a cel-go compile error. The classes are the ones the
// Rust side maps its CheckErrorKind onto (tests/cel_differential.rs).
func checkClass(msg string) string {
	switch {
	case strings.Contains(msg, "Syntax error"), strings.Contains(msg, "reserved identifier"):
		return "syntax"
	case strings.Contains(msg, "cannot be range of a comprehension"):
		return "not_a_range"
	case strings.Contains(msg, "does not support field selection"):
		return "no_fields"
	case strings.Contains(msg, "math.greatest()"), strings.Contains(msg, "math.least()"):
		// The math macros validate their arguments when they expand.
		return "macro_argument"
	case strings.Contains(msg, "undeclared reference"):
		return "undeclared"
	case strings.Contains(msg, "found no matching overload"):
		return "no_matching_overload"
	case strings.Contains(msg, "undefined field"):
		return "undefined_field"
	case strings.Contains(msg, "expected type"), strings.Contains(msg, "type mismatch"):
		return "type_mismatch"
	default:
		return "other"
	}
}

// evalClass buckets a cel-go evaluation error.
func evalClass(msg string) string {
	m := strings.ToLower(msg)
	switch {
	case strings.Contains(m, "no such key"):
		return "no_such_key"
	case strings.Contains(m, "division by zero"):
		return "division_by_zero"
	case strings.Contains(m, "modulus by zero"):
		return "modulus_by_zero"
	case strings.Contains(m, "index out of range"), strings.Contains(m, "index out of bounds"):
		return "index_out_of_range"
	case strings.Contains(m, "overflow"):
		return "overflow"
	case strings.Contains(m, "no such overload"), strings.Contains(m, "no matching overload"):
		return "no_such_overload"
	default:
		return "invalid_argument"
	}
}

// parseType reads the corpus's type syntax: string, int, uint, double, bool,
// bytes, dyn, null, list(T), map(K, V).
func parseType(s string) (*cel.Type, string, error) {
	s = strings.TrimSpace(s)
	simple := map[string]*cel.Type{
		"string": cel.StringType, "int": cel.IntType, "uint": cel.UintType, "double": cel.DoubleType,
		"bool": cel.BoolType, "bytes": cel.BytesType, "dyn": cel.DynType, "null": cel.NullType,
	}
	for _, p := range []string{"list(", "map("} {
		if strings.HasPrefix(s, p) {
			a, rest, err := parseType(s[len(p):])
			if err != nil {
				return nil, "", err
			}
			if p == "list(" {
				if !strings.HasPrefix(rest, ")") {
					return nil, "", fmt.Errorf("want ) in %q", s)
				}
				return cel.ListType(a), strings.TrimSpace(rest[1:]), nil
			}
			if !strings.HasPrefix(rest, ",") {
				return nil, "", fmt.Errorf("want , in %q", s)
			}
			b, rest, err := parseType(rest[1:])
			if err != nil || !strings.HasPrefix(rest, ")") {
				return nil, "", fmt.Errorf("bad map in %q", s)
			}
			return cel.MapType(a, b), strings.TrimSpace(rest[1:]), nil
		}
	}
	end := strings.IndexAny(s, ",)")
	if end < 0 {
		end = len(s)
	}
	t, ok := simple[strings.TrimSpace(s[:end])]
	if !ok {
		return nil, "", fmt.Errorf("unknown type %q", s[:end])
	}
	return t, s[end:], nil
}

// native converts a YAML value (numbers arrive as float64) to the Go value
// of the declared type; dyn keeps JSON's own typing, as json.unmarshal does.
func native(t *cel.Type, v any) any {
	switch t.Kind() {
	case types.IntKind:
		return int64(v.(float64))
	case types.UintKind:
		return uint64(v.(float64))
	case types.DoubleKind:
		return v.(float64)
	case types.ListKind:
		xs, _ := v.([]any)
		out := make([]any, len(xs))
		for i, x := range xs {
			out[i] = native(t.Parameters()[0], x)
		}
		return out
	case types.MapKind:
		m, _ := v.(map[string]any)
		out := make(map[string]any, len(m))
		for k, x := range m {
			out[k] = native(t.Parameters()[1], x)
		}
		return out
	default:
		return v
	}
}

// encode is the canonical JSON shape of a value, shared with the Rust side:
// int and string and bool and null and list as themselves; uint, double,
// bytes, map, duration, timestamp, type and library types tagged, so that
// 1, 1u and 1.0 stay distinct and map key order does not matter.
func encode(v ref.Val) any {
	switch x := v.(type) {
	case types.Bool:
		return bool(x)
	case types.Int:
		return int64(x)
	case types.Uint:
		return map[string]any{"uint": uint64(x)}
	case types.Double:
		f := float64(x)
		switch {
		case math.IsNaN(f):
			return map[string]any{"double": "NaN"}
		case math.IsInf(f, 1):
			return map[string]any{"double": "+Inf"}
		case math.IsInf(f, -1):
			return map[string]any{"double": "-Inf"}
		}
		return map[string]any{"double": f}
	case types.String:
		return string(x)
	case types.Bytes:
		return map[string]any{"bytes": base64.StdEncoding.EncodeToString([]byte(x))}
	case types.Null:
		return nil
	case types.Duration:
		return map[string]any{"duration_ns": x.Duration.Nanoseconds()}
	case types.Timestamp:
		return map[string]any{"timestamp": x.Time.UTC().Format(time.RFC3339Nano)}
	case ref.Type:
		return map[string]any{"type": x.TypeName()}
	case traits.Lister:
		out := []any{}
		it := x.Iterator()
		for it.HasNext() == types.True {
			out = append(out, encode(it.Next()))
		}
		return out
	case traits.Mapper:
		type kv struct {
			k string
			e []any
		}
		var entries []kv
		it := x.Iterator()
		for it.HasNext() == types.True {
			k := it.Next()
			ke := encode(k)
			kj, _ := json.Marshal(ke)
			entries = append(entries, kv{string(kj), []any{ke, encode(x.Get(k))}})
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].k < entries[j].k })
		out := []any{}
		for _, e := range entries {
			out = append(out, e.e)
		}
		return map[string]any{"map": out}
	default:
		return map[string]any{"opaque": v.Type().TypeName()}
	}
}

// runBench compiles (parse, check, plan) and evaluates every case that
// checks, n times each, and prints ns per expression per phase.
func runBench(base *cel.Env, cases []Case, n int) {
	type prepared struct {
		env *cel.Env
		act map[string]any
		src string
		prg cel.Program
	}
	var ps []prepared
	for _, c := range cases {
		env, act, err := caseEnv(base, c)
		if err != nil {
			fatal(err)
		}
		ast, iss := env.Compile(c.Expr)
		if iss.Err() != nil {
			continue
		}
		prg, err := env.Program(ast)
		if err != nil {
			continue
		}
		ps = append(ps, prepared{env, act, c.Expr, prg})
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		for _, p := range ps {
			ast, _ := p.env.Compile(p.src)
			if _, err := p.env.Program(ast); err != nil {
				fatal(err)
			}
		}
	}
	compile := time.Since(start)
	start = time.Now()
	for i := 0; i < n; i++ {
		for _, p := range ps {
			_, _, _ = p.prg.Eval(p.act)
		}
	}
	eval := time.Since(start)
	per := float64(n * len(ps))
	out, _ := json.Marshal(map[string]any{
		"implementation":      "cel-go",
		"expressions":         len(ps),
		"iterations":          n,
		"compile_ns_per_expr": float64(compile.Nanoseconds()) / per,
		"eval_ns_per_expr":    float64(eval.Nanoseconds()) / per,
	})
	fmt.Println(string(out))
}
