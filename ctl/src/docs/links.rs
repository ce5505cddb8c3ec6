//! Internal links of Markdown pages: what they point at and whether it
//! exists. Parsed with pulldown-cmark (mdBook's parser), so links in code
//! blocks and code spans are not links, as in the book.

use std::collections::{BTreeMap, BTreeSet};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// The anchor mdBook gives a heading with text `text`: lowercase, whitespace
/// to `-`, only alphanumerics, `-` and `_` kept.
pub(crate) fn heading_id(text: &str) -> String {
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".to_string())
            } else {
                None
            }
        })
        .collect()
}

fn options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_HEADING_ATTRIBUTES
}

/// Every anchor a page has: its headings' ids (an explicit `{#id}`, else
/// from the text, a repeated one numbered `-1`, `-2` as mdBook does) and
/// the `id="..."` of its HTML.
pub(crate) fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut heading: Option<(Option<String>, String)> = None;
    for event in Parser::new_ext(text, options()) {
        match event {
            Event::Start(Tag::Heading { id, .. }) => {
                heading = Some((id.map(|i| i.to_string()), String::new()));
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, h)) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((explicit, h)) = heading.take() {
                    let id = explicit.unwrap_or_else(|| heading_id(&h));
                    let n = counts.entry(id.clone()).or_insert(0);
                    out.insert(if *n == 0 { id } else { format!("{id}-{n}") });
                    *n += 1;
                }
            }
            Event::Html(h) | Event::InlineHtml(h) => out.extend(html_ids(&h)),
            _ => {}
        }
    }
    out
}

fn html_ids(html: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for (i, _) in html.match_indices("id=\"") {
        let rest = &html[i + 4..];
        if let Some(end) = rest.find('"') {
            ids.push(rest[..end].to_string());
        }
    }
    ids
}

/// A link of a page.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Link {
    /// 1-based.
    pub(crate) line: usize,
    pub(crate) dest: String,
}

/// Every link and image of a page that is not external (http, https,
/// mailto and other schemes are left to the web).
pub(crate) fn internal_links(text: &str) -> Vec<Link> {
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let line_of = |offset: usize| line_starts.partition_point(|&s| s <= offset);
    let mut out = Vec::new();
    for (event, range) in Parser::new_ext(text, options()).into_offset_iter() {
        let dest = match event {
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => dest_url,
            _ => continue,
        };
        if dest.is_empty() || is_external(&dest) {
            continue;
        }
        out.push(Link {
            line: line_of(range.start),
            dest: dest.to_string(),
        });
    }
    out
}

fn is_external(dest: &str) -> bool {
    if dest.starts_with("//") {
        return true;
    }
    match dest.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && !scheme.contains(['/', '#', '.'])
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-'))
        }
        None => false,
    }
}
