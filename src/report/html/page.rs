//! The frame every probe page shares (its head, style and closing script) and the
//! escaping of everything from a dump: dumps are untrusted input. `config_check/html`
//! builds its page on the same frame.

use std::fmt::Write as _;

/// Escapes text for html element content and attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A number for people: short scientific notation, `inf`/`NaN` spelled out.
pub(crate) fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else if v == 0.0 {
        "0".into()
    } else if (1e-3..1e4).contains(&v.abs()) {
        format!("{}", (v * 1e4).round() / 1e4)
    } else {
        format!("{v:.2e}")
    }
}

/// The style shared by every probe page (inline: the page must open offline).
pub(crate) const STYLE: &str = "\
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d2330;margin:0;background:#f6f7f9}
main{max-width:1240px;margin:0 auto;padding:18px 20px 40px}
h1{font-size:20px;margin:0 0 6px}h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid #d8dce3;padding-bottom:4px}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;color:#fff;font-weight:600;font-size:12px;vertical-align:2px;text-transform:uppercase}
.b-pass{background:#2e7d32}.b-warning{background:#b26a00}.b-error{background:#c8102e}.b-skipped,.b-expected,.b-ignored{background:#6b7280}
.headline{font-size:15px;background:#fff;border-left:4px solid #8892a6;padding:8px 12px;margin:8px 0}
.headline.error{border-color:#c8102e}.headline.warning{border-color:#b26a00}.headline.pass{border-color:#2e7d32}
table{border-collapse:collapse;background:#fff;font-size:13px}td,th{border:1px solid #e1e4ea;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#fff;border:1px solid #e1e4ea;padding:8px;overflow-x:auto;margin:4px 0}
.card{background:#fff;border:1px solid #e1e4ea;padding:10px 14px;margin:8px 0}
.culprit{border-left:4px solid #c8102e}
details{margin:2px 0}details details{margin-left:18px}summary{cursor:pointer}
.muted{color:#6b7280}.error{color:#c8102e}.warning{color:#b26a00}
svg{background:#fff;border:1px solid #e1e4ea;max-width:100%;height:auto}
svg text{font:11px system-ui,sans-serif;fill:#394150}svg .lbl{font-weight:600;fill:#1d2330}
";

/// The page's head and opening `main`.
pub(crate) fn open_page(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
<title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n<main>\n",
        esc(title)
    );
}

/// Closes the page; the inline script marks the document ready (`data-ready` on `<html>`,
/// the number of plotted points) so that a headless browser check can tell it ran.
pub(crate) fn close_page(out: &mut String) {
    out.push_str(
        "</main>\n<script>\n(function(){var n=document.querySelectorAll('#plot .pt').length;\
document.documentElement.setAttribute('data-ready',String(n));})();\n</script>\n</body>\n</html>\n",
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }
}
