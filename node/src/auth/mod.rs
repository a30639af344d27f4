//! Authorization: who a caller is and what it may call (docs/SECURITY.md §2, §3, §5).
//!
//! - `roles`: the roles (`client` ⊂ `operator` ⊂ `admin`, and `node`) and the principal →
//!   role map of the configuration;
//! - `tokens`: the file of hashed bearer tokens and the constant-time lookup;
//! - `methods`: which role each gRPC method requires;
//! - `policy`: the decision for one call, pure;
//! - `layer`: the tower layer on the serve loop that applies the decision to every request,
//!   inserts the [`Caller`](crate::peer::Caller) and answers refusals.
//!
//! Whether a *session* may be used by the caller is not decided here but where the session
//! lives (the backends, docs/DESIGN.md D-session-principal): this layer only establishes who
//! calls.

pub mod layer;
pub mod methods;
pub mod policy;
pub mod roles;
pub mod tokens;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub use layer::{Access, AuthLayer};
pub use policy::Policy;
pub use roles::Role;
pub use tokens::Tokens;

impl Access {
    /// The access of a node: [`Access::Open`] if `insecure`, else a policy of `roles` and the
    /// tokens file at `tokens_file` (read now; its errors name `file:line`).
    pub fn for_node(
        insecure: bool,
        roles: &BTreeMap<String, Role>,
        tokens_file: Option<&Path>,
    ) -> Result<Access, String> {
        if insecure {
            return Ok(Access::Open);
        }
        let tokens = match tokens_file {
            Some(path) => Tokens::load(path)?,
            None => Tokens::default(),
        };
        Ok(Access::Enforced(Arc::new(Policy::new(
            roles.clone(),
            tokens,
        ))))
    }
}
