//! A JSON Schema (schemars, from the Rust types) as Markdown: one field table
//! for the root type and one for each type it uses, each under its own heading.

use std::collections::{BTreeSet, VecDeque};

use serde_json::{Map, Value};

use super::cell;

/// The schema of `T` as deserialization sees it (defaults included).
pub(super) fn schema_of<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    generator.into_root_schema_for::<T>().to_value()
}

/// Renders `schema` (a root schema with `$defs`) for `kind`: the root's
/// fields, then every type it reaches, in the order first reached. Type
/// headings are `### `Type` (kind)`, so the same type under two kinds on
/// one page gets two anchors.
pub(super) fn render(out: &mut String, kind: &str, schema: &Value) {
    let empty = Map::new();
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let r = Renderer { kind };
    if let Some(d) = description(schema) {
        out.push_str(&format!("{}\n\n", cell(d)));
    }
    r.body(out, schema);
    let mut seen = BTreeSet::new();
    let mut queue: VecDeque<String> = VecDeque::new();
    refs(schema, &mut |name| {
        if seen.insert(name.to_string()) {
            queue.push_back(name.to_string());
        }
    });
    while let Some(name) = queue.pop_front() {
        let Some(def) = defs.get(&name) else {
            continue;
        };
        out.push_str(&format!("\n### `{name}` ({kind})\n\n"));
        if let Some(d) = description(def) {
            out.push_str(&format!("{}\n\n", cell(d)));
        }
        r.body(out, def);
        refs(def, &mut |n| {
            if seen.insert(n.to_string()) {
                queue.push_back(n.to_string());
            }
        });
    }
}

/// Calls `f` with every `$ref`'d type name in `v`, in document order.
fn refs(v: &Value, f: &mut impl FnMut(&str)) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("$defs", _) => {}
                    ("$ref", Value::String(r)) => f(ref_name(r)),
                    _ => refs(x, f),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, f)),
        _ => {}
    }
}

fn ref_name(r: &str) -> &str {
    r.rsplit('/').next().unwrap_or(r)
}

fn description(v: &Value) -> Option<&str> {
    v.get("description").and_then(Value::as_str)
}

struct Renderer<'a> {
    kind: &'a str,
}

impl Renderer<'_> {
    /// A type's fields and, for an enum, its values.
    fn body(&self, out: &mut String, v: &Value) {
        if let Some(props) = v.get("properties").and_then(Value::as_object) {
            self.fields(out, v, props);
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(variants) = v.get(key).and_then(Value::as_array) {
                self.variants(out, variants);
            }
        }
        if let Some(values) = v.get("enum").and_then(Value::as_array) {
            out.push_str("| Value | Meaning |\n| --- | --- |\n");
            for x in values {
                out.push_str(&format!("| `{}` | |\n", plain(x)));
            }
        }
        if let Some(all) = v.get("allOf").and_then(Value::as_array) {
            for x in all {
                self.body(out, x);
            }
        }
        if v.get("properties").is_none()
            && v.get("oneOf").is_none()
            && v.get("anyOf").is_none()
            && v.get("enum").is_none()
            && v.get("allOf").is_none()
        {
            out.push_str(&format!("Type: {}\n", self.type_of(v)));
        }
    }

    /// The field table of an object.
    fn fields(&self, out: &mut String, v: &Value, props: &Map<String, Value>) {
        if props.is_empty() {
            out.push_str("No fields.\n\n");
            return;
        }
        let required: BTreeSet<&str> = v
            .get("required")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        out.push_str("| Field | Type | Default | Meaning |\n| --- | --- | --- | --- |\n");
        for (name, p) in props {
            let default = match p.get("default") {
                _ if required.contains(name.as_str()) => "**required**".to_string(),
                Some(Value::Null) | None => "none".to_string(),
                Some(d) => format!("`{}`", cell(&compact(d))),
            };
            out.push_str(&format!(
                "| `{name}` | {} | {default} | {} |\n",
                self.type_of(p),
                description(p).map(cell).unwrap_or_default()
            ));
        }
        out.push('\n');
    }

    /// The value table of an enum, then the fields of each variant that has any.
    fn variants(&self, out: &mut String, variants: &[Value]) {
        let variants: Vec<&Value> = variants.iter().filter(|v| !is_null(v)).collect();
        if variants.len() == 1 && variants[0].get("$ref").is_some() {
            out.push_str(&format!("Type: {}\n\n", self.type_of(variants[0])));
            return;
        }
        out.push_str("| Value | Meaning |\n| --- | --- |\n");
        let mut with_fields = Vec::new();
        for v in &variants {
            let (value, inner) = variant(v);
            let meaning = description(v)
                .or_else(|| inner.and_then(description))
                .map(cell)
                .unwrap_or_default();
            let fields = inner
                .and_then(|i| i.get("properties"))
                .and_then(Value::as_object);
            let empty_object = inner.is_some_and(|i| self.type_of(i) == "object");
            let shown = match inner {
                Some(_) if fields.is_none() && empty_object => format!("`{value}: {{}}`"),
                Some(i) if fields.is_none() => format!("`{value}`: {}", self.type_of(i)),
                _ => format!("`{value}`"),
            };
            out.push_str(&format!("| {shown} | {meaning} |\n"));
            if let (Some(i), Some(f)) = (inner, fields) {
                if !f.is_empty() {
                    with_fields.push((value, i, f));
                }
            }
        }
        out.push('\n');
        for (value, inner, fields) in with_fields {
            out.push_str(&format!("Fields of `{value}`:\n\n"));
            self.fields(out, inner, fields);
        }
    }

    /// A field's type in words, with links to the types it names.
    fn type_of(&self, v: &Value) -> String {
        if let Some(r) = v.get("$ref").and_then(Value::as_str) {
            let name = ref_name(r);
            let anchor = super::links::heading_id(&format!("{name} ({})", self.kind));
            return format!("[`{name}`](#{anchor})");
        }
        if let Some(c) = v.get("const") {
            return format!("`{}`", plain(c));
        }
        if let Some(values) = v.get("enum").and_then(Value::as_array) {
            let names: Vec<String> = values.iter().map(|x| format!("`{}`", plain(x))).collect();
            return format!("one of {}", names.join(", "));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = v.get(key).and_then(Value::as_array) {
                let alts: Vec<String> = alts
                    .iter()
                    .filter(|a| !is_null(a))
                    .map(|a| self.type_of(a))
                    .collect();
                return alts.join(" or ");
            }
        }
        let types: Vec<&str> = match v.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts
                .iter()
                .filter_map(Value::as_str)
                .filter(|t| *t != "null")
                .collect(),
            _ => Vec::new(),
        };
        let base = match types.first().copied() {
            Some("array") => match v.get("items") {
                Some(items) => format!("list of {}", self.type_of(items)),
                None => "list".to_string(),
            },
            Some("object") => match v.get("additionalProperties") {
                Some(Value::Bool(false)) | None => "object".to_string(),
                Some(Value::Bool(true)) => "map".to_string(),
                Some(values) => format!("map of string to {}", self.type_of(values)),
            },
            Some(t) => t.to_string(),
            None => "any".to_string(),
        };
        match v.get("format").and_then(Value::as_str) {
            Some(f) => format!("{base} ({f})"),
            None => base,
        }
    }
}

/// An enum variant's value and, for a variant with data, the schema of its data.
fn variant(v: &Value) -> (String, Option<&Value>) {
    if let Some(c) = v.get("const") {
        return (plain(c), None);
    }
    if let Some(one) = v
        .get("enum")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 1)
    {
        return (plain(&one[0]), None);
    }
    let props = v.get("properties").and_then(Value::as_object);
    if let Some(props) = props {
        // internally tagged (`tag = "kind"`): the tag is the property with a const
        if let Some((tag, t)) = props.iter().find(|(_, p)| p.get("const").is_some()) {
            let value = format!("{tag}: {}", t.get("const").map(plain).unwrap_or_default());
            return (value, Some(v));
        }
        // externally tagged: one property, the variant's name
        if props.len() == 1 {
            if let Some((name, inner)) = props.iter().next() {
                return (name.clone(), Some(inner));
            }
        }
    }
    ("(value)".to_string(), Some(v))
}

fn is_null(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("null")
}

/// A JSON value as text: strings bare, everything else as JSON.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => compact(other),
    }
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}
