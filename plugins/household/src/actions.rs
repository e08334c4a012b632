//! The action language: what the agent may do, how each action is written, and what it does.
//!
//! Actions are short, fixed templates (`go to cabinet 2`, `take mug 1 from cabinet 2`,
//! `put mug 1 in cabinet 2`, `heat apple 1 with microwave 1`, `use desklamp 1`, `look`,
//! `inventory`). [`admissible`] lists those that do something now; [`parse`] accepts exactly
//! those strings, after trimming, lower-casing and collapsing runs of whitespace. Anything else
//! is not an error but an ordinary invalid move: the episode answers `nothing happens .`.

use crate::catalog::{RecKind, TaskKind};
use crate::state::State;
use crate::world::{Place, Temperature};

/// One admissible action. Indices point into the layout's receptacles and objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    GoTo(usize),
    Open(usize),
    Close(usize),
    Take { object: usize, from: usize },
    Put { object: usize, to: usize },
    Clean { object: usize, with: usize },
    Heat { object: usize, with: usize },
    Cool { object: usize, with: usize },
    UseLamp,
    Look,
    Inventory,
}

impl Action {
    /// The action as the policy writes it.
    pub fn text(&self, state: &State) -> String {
        let rec = |r: usize| state.layout.receptacles[r].name();
        let obj = |o: usize| state.layout.objects[o].name();
        match *self {
            Action::GoTo(r) => format!("go to {}", rec(r)),
            Action::Open(r) => format!("open {}", rec(r)),
            Action::Close(r) => format!("close {}", rec(r)),
            Action::Take { object, from } => format!("take {} from {}", obj(object), rec(from)),
            Action::Put { object, to } => {
                let prep = state.layout.receptacles[to].kind.preposition();
                format!("put {} {prep} {}", obj(object), rec(to))
            }
            Action::Clean { object, with } => format!("clean {} with {}", obj(object), rec(with)),
            Action::Heat { object, with } => format!("heat {} with {}", obj(object), rec(with)),
            Action::Cool { object, with } => format!("cool {} with {}", obj(object), rec(with)),
            Action::UseLamp => "use desklamp 1".into(),
            Action::Look => "look".into(),
            Action::Inventory => "inventory".into(),
        }
    }
}

/// The actions that are valid now, in a fixed order: moves, open/close, take, put, appliance
/// actions, the lamp, then `look` and `inventory`.
pub(crate) fn admissible(state: &State) -> Vec<Action> {
    let layout = &state.layout;
    let mut actions: Vec<Action> = (0..layout.receptacles.len())
        .filter(|&r| state.location != Some(r))
        .map(Action::GoTo)
        .collect();
    if let Some(here) = state.location {
        let kind = layout.receptacles[here].kind;
        if kind.openable() {
            actions.push(if state.open[here] {
                Action::Close(here)
            } else {
                Action::Open(here)
            });
        }
        let held = state.holding();
        if state.reachable(here) {
            match held {
                None => actions.extend(
                    state
                        .contents(here)
                        .map(|object| Action::Take { object, from: here }),
                ),
                Some(object) => actions.push(Action::Put { object, to: here }),
            }
        }
        if let Some(object) = held {
            match kind {
                RecKind::Sinkbasin => actions.push(Action::Clean { object, with: here }),
                RecKind::Microwave => actions.push(Action::Heat { object, with: here }),
                RecKind::Fridge => actions.push(Action::Cool { object, with: here }),
                _ => {}
            }
        }
        if layout.lamp == Some(here) {
            actions.push(Action::UseLamp);
        }
    }
    actions.push(Action::Look);
    actions.push(Action::Inventory);
    actions
}

/// Canonical form of policy text: trimmed, lower-case, single spaces.
pub(crate) fn normalize(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// The admissible action `text` names, if any.
pub(crate) fn parse(state: &State, text: &str) -> Option<Action> {
    let wanted = normalize(text);
    admissible(state)
        .into_iter()
        .find(|a| a.text(state) == wanted)
}

/// Applies an admissible action (a no-op where it changes nothing: `look`, `inventory`,
/// heating what is hot, the lamp without the target in hand).
pub(crate) fn apply(state: &mut State, action: Action) {
    let examines_target = action == Action::UseLamp
        && state.goal.kind == TaskKind::LookAtObjInLight
        && state
            .holding()
            .is_some_and(|h| state.layout.objects[h].kind == state.goal.target);
    let objects = &mut state.layout.objects;
    match action {
        Action::GoTo(r) => state.location = Some(r),
        Action::Open(r) => state.open[r] = true,
        Action::Close(r) => state.open[r] = false,
        Action::Take { object, .. } => objects[object].place = Place::Held,
        Action::Put { object, to } => objects[object].place = Place::At(to),
        Action::Clean { object, .. } => objects[object].clean = true,
        Action::Heat { object, .. } => objects[object].temperature = Temperature::Hot,
        Action::Cool { object, .. } => objects[object].temperature = Temperature::Cold,
        Action::UseLamp => state.examined |= examines_target,
        Action::Look | Action::Inventory => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use crate::world::{generate, Knobs};

    fn state(kind: TaskKind, seed: u64) -> State {
        let knobs = Knobs {
            receptacles: (6, 9),
            distractors: (2, 5),
            knowledge: false,
        };
        State::new(&generate(kind, &knobs, &mut SplitMix64::new(seed)))
    }

    #[test]
    fn parse_accepts_admissible_texts_with_loose_whitespace_and_case() {
        let s = state(TaskKind::PickAndPlace, 3);
        let first = admissible(&s)[0];
        let text = first.text(&s);
        assert_eq!(parse(&s, &text), Some(first));
        let loose = format!("  {}\n", text.to_uppercase().replace(' ', "   "));
        assert_eq!(parse(&s, &loose), Some(first));
        for bad in [
            "",
            "go to",
            "go to the moon",
            &format!("{text} ."),
            "take",
            "\u{0}",
            "look look",
        ] {
            assert_eq!(parse(&s, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn admissible_texts_are_distinct() {
        for kind in TaskKind::ALL {
            let mut s = state(kind, 11);
            let mut rng = SplitMix64::new(5);
            for _ in 0..40 {
                let actions = admissible(&s);
                let mut texts: Vec<String> = actions.iter().map(|a| a.text(&s)).collect();
                texts.sort();
                texts.dedup();
                assert_eq!(texts.len(), actions.len());
                apply(&mut s, actions[rng.below(actions.len())]);
                s.observe();
            }
        }
    }
}
