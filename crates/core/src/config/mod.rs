//! Configuration: the single source of truth for every environment variable.
//!
//! Owns: the variable table ([`vars`]), strict parsing ([`spec`]), the live registry with
//! precedence, read-once fixing and `MXSetEnv` ([`registry`]), and the reference table in
//! `docs/configuration.md` generated from the table. Other modules read configuration only
//! through [`global`].

pub mod registry;
pub mod spec;
pub mod suggest;
pub mod vars;

pub use registry::{EnvSource, MapEnv, ProcessEnv, Registry, Resolved, Source};
pub use spec::{Reading, Status, Value, VarSpec, VarType};

use std::sync::OnceLock;

/// The process-wide registry over the process environment. Created at the first use; that
/// first use prints one warning per unknown `MXNET_*` variable in the environment.
pub fn global() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let r = Registry::new(vars::VARS, Box::new(ProcessEnv));
        r.warn_unknown_in_env();
        r
    })
}

/// The Markdown reference table of every variable, as `docs/configuration.md` carries it.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| variable | type | default | accepted values | read | in this build | description |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mut category = "";
    for v in vars::VARS {
        if v.category != category {
            category = v.category;
            out.push_str(&format!("| **{category}** | | | | | | |\n"));
        }
        let default = v.default.map(|d| format!("`{d}`")).unwrap_or_else(|| "unset".into());
        let mut doc = v.doc.to_string();
        if let Some(f) = v.fallback {
            doc.push_str(&format!(" When unset, `{f}` is used."));
        }
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} |\n",
            v.name,
            v.ty.type_name(),
            default,
            v.ty.accepted().replace('|', "\\|"),
            match v.reading {
                Reading::Once => "once",
                Reading::Dynamic => "each use",
            },
            v.status.name(),
            doc.replace('|', "\\|"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/configuration.md`'s table is generated from the registry; regenerate it with
    /// `MXNET_RT_BLESS=1 cargo test`.
    #[test]
    fn readme_table_is_fresh() {
        const BEGIN: &str = "<!-- BEGIN CONFIG TABLE (generated from crates/core/src/config/vars.rs) -->\n";
        const END: &str = "<!-- END CONFIG TABLE -->";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
        let readme = std::fs::read_to_string(path).expect("docs/configuration.md");
        let start = readme.find(BEGIN).expect("docs/configuration.md has the table's BEGIN marker") + BEGIN.len();
        let end = readme.find(END).expect("docs/configuration.md has the table's END marker");
        let want = markdown_table();
        if readme[start..end] != want {
            if std::env::var_os("MXNET_RT_BLESS").is_some() {
                let updated = format!("{}{}{}", &readme[..start], want, &readme[end..]);
                std::fs::write(path, updated).unwrap();
            } else {
                panic!("docs/configuration.md's configuration table is stale: run MXNET_RT_BLESS=1 cargo test");
            }
        }
    }
}
