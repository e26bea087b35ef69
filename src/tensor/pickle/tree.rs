//! What a checkpoint's pickle built ([`Policy::Checkpoint`]), turned into plain data: a
//! [`Node`] tree, with limits on depth and size (memo references can share one value many
//! times, and a list can hold itself).

use super::budget::{Budget, Held};
use super::PickledTensor;
use super::{run_pickle, Global, Policy, Val, MAX_DEPTH, V};

/// A value a checkpoint's pickle built, as plain data.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// None.
    None,
    /// A bool.
    Bool(bool),
    /// An int.
    Int(i64),
    /// A float.
    Float(f64),
    /// A str.
    Str(String),
    /// Bytes (content not kept).
    Bytes,
    /// A tuple, list, set or frozenset.
    List(Vec<Node>),
    /// A dict or OrderedDict, in insertion order.
    Dict(Vec<(Node, Node)>),
    /// A class or function named but not called.
    Global(String),
    /// A tensor, not yet located in the archive (boxed: the other nodes, a checkpoint's
    /// many, stay small).
    Tensor(Box<PickledTensor>),
    /// An opaque object: its class, constructor arguments and BUILD state (None if none).
    Object {
        /// Dotted class name.
        class: String,
        /// The arguments of its call.
        args: Box<Node>,
        /// BUILD's state.
        state: Box<Node>,
    },
}

impl Node {
    /// The value of `key` in a dict node (str keys), or in an object's dict state (a
    /// dataclass, `argparse.Namespace`; a slotted class's `(None, {slots})` too).
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Dict(items) => items.iter().find_map(|(k, v)| match k {
                Node::Str(s) if s == key => Some(v),
                _ => None,
            }),
            Node::Object { state, .. } => match &**state {
                Node::List(parts) if parts.len() == 2 => {
                    parts[1].get(key).or_else(|| parts[0].get(key))
                }
                s => s.get(key),
            },
            _ => None,
        }
    }
}

/// Runs the machine over a checkpoint's pickle ([`Policy::Checkpoint`]) and returns what
/// it built as a [`Node`] tree.
pub fn parse_tree(bytes: &[u8]) -> std::result::Result<Node, String> {
    // The machine's values live while the tree is made of them (which copies a shared value
    // at each of its references): one budget for both.
    let mut budget = Budget::for_input(bytes.len());
    // Declared before the value, dropped after it: its containers emptied once the tree is made.
    let mut held = Held::default();
    let v = run_pickle(bytes, Policy::Checkpoint, &mut budget, &mut held)
        .map_err(crate::error::one_line)?;
    to_node(&v, 0, &mut budget).map_err(crate::error::one_line)
}

/// What a node costs beyond its slot: the text and dimensions it owns.
fn own_bytes(v: &V) -> usize {
    match v {
        V::Str(s) => s.len(),
        V::Global(Global::Opaque(name)) => name.len(),
        V::Tensor(t) => {
            std::mem::size_of::<PickledTensor>()
                + t.storage_key.len()
                + 8 * (t.shape.len() + t.stride.len())
        }
        V::Object(o) => o.class.len() + 2 * std::mem::size_of::<Node>(),
        _ => 0,
    }
}

fn to_node(v: &V, depth: usize, budget: &mut Budget) -> std::result::Result<Node, String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "pickle nests values deeper than {MAX_DEPTH} levels"
        ));
    }
    budget.charge(std::mem::size_of::<Node>() + own_bytes(v))?;
    let d = depth + 1;
    let list = |items: &[Val], budget: &mut Budget| -> std::result::Result<Node, String> {
        let items = items.iter().map(|x| to_node(x, d, budget));
        Ok(Node::List(items.collect::<std::result::Result<_, _>>()?))
    };
    Ok(match v {
        V::Mark => return Err("a mark left on the pickle stack".into()),
        V::None => Node::None,
        V::Bool(b) => Node::Bool(*b),
        V::Int(i) => Node::Int(*i),
        V::Float(f) => Node::Float(*f),
        V::Str(s) => Node::Str(s.clone()),
        V::Bytes => Node::Bytes,
        V::Tuple(items) => list(items, budget)?,
        V::List(items) => list(&items.borrow(), budget)?,
        V::Dict(items) => Node::Dict(
            items
                .borrow()
                .iter()
                .map(|(k, x)| Ok((to_node(k, d, budget)?, to_node(x, d, budget)?)))
                .collect::<std::result::Result<_, String>>()?,
        ),
        V::Global(Global::Opaque(name)) => Node::Global(name.clone()),
        V::Global(g) => Node::Global(format!("{g:?}")),
        V::Storage(_) => return Err("a storage outside a tensor".into()),
        V::Tensor(t) => Node::Tensor(t.clone()),
        V::Object(o) => Node::Object {
            class: o.class.clone(),
            args: Box::new(to_node(&o.args, d, budget)?),
            state: Box::new(match &*o.state.borrow() {
                Some(s) => to_node(s, d, budget)?,
                None => Node::None,
            }),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_code_globals_in_checkpoints() {
        for (m, n) in [
            ("os", "system"),
            ("builtins", "eval"),
            ("torch", "load"),
            ("subprocess", "Popen"),
        ] {
            let mut p = b"\x80\x02c".to_vec();
            p.extend(format!("{m}\n{n}\nq\x00.").bytes());
            let e = parse_tree(&p).unwrap_err();
            assert!(e.contains(&format!("{m}.{n}")), "{e}");
        }
    }

    #[test]
    fn opaque_objects_keep_their_state() {
        // argparse.Namespace() with BUILD {'hidden_size': 8}, in a dict under 'args'.
        let p = b"\x80\x02}q\x00X\x04\x00\x00\x00argsq\x01cargparse\nNamespace\nq\x02)\x81q\x03}q\x04X\x0b\x00\x00\x00hidden_sizeq\x05K\x08sbs.";
        let n = parse_tree(p).unwrap();
        let args = n.get("args").unwrap();
        assert_eq!(args.get("hidden_size"), Some(&Node::Int(8)));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let mut p = b"\x80\x02".to_vec();
        p.extend(std::iter::repeat_n(b']', 100));
        p.extend(std::iter::repeat_n(b'a', 99));
        p.push(b'.');
        assert!(parse_tree(&p).unwrap_err().contains("deeper"));
    }
}
