//! The expert planner: a non-privileged, deterministic policy that solves every task.
//!
//! It uses only what the observation text shows (the goal, the location and whether it is
//! closed, the visible contents, the held object and its state, the `seen :` and
//! `unsearched :` lists, and the fixed appliance names), so its choices are a learnable
//! function of the text. Its plan, in priority order:
//!
//! 1. Holding a target: give it the required state at the appliance (`clean` at sinkbasin 1,
//!    `heat` at microwave 1, `cool` at fridge 1), then `use desklamp 1` where the lamp stands
//!    (light tasks) or go to the destination, open it if closed, and put it there.
//! 2. Holding anything else (only after a policy's detour): put it down where it stands, or at
//!    the destination (or lamp) when it stands nowhere.
//! 3. Hands empty: take the first wanted object in sight; else go to (or open) the first place
//!    in `seen :`; else open the unsearched container it stands at; else go to the first place
//!    in `unsearched :`.
//!
//! In the knowledge regime it does not know the homes either: it searches in the listed
//! (per-task shuffled) order, so its demonstrations do not teach where objects live.

use crate::actions::Action;
use crate::catalog::TaskKind;
use crate::state::State;

/// The expert's next action in `state` (which must not be solved).
pub(crate) fn next_action(state: &State) -> Action {
    let goal = state.goal;
    let layout = &state.layout;
    let here = state.location;
    let go_or = |r: usize, there: Action| {
        if here == Some(r) {
            there
        } else {
            Action::GoTo(r)
        }
    };
    // Where the work ends: the destination, or the lamp for a light task.
    let finish = goal
        .destination
        .or(layout.lamp)
        .expect("every task has a destination or a lamp");

    if let Some(held) = state.holding() {
        let object = &layout.objects[held];
        if object.kind == goal.target {
            if !goal.state_met(object) {
                let kind = goal
                    .kind
                    .appliance()
                    .expect("only appliance tasks have unmet states");
                let with = layout
                    .find(kind)
                    .expect("the generator adds the task's appliance");
                let act = match goal.kind {
                    TaskKind::PickCleanThenPlace => Action::Clean { object: held, with },
                    TaskKind::PickHeatThenPlace => Action::Heat { object: held, with },
                    _ => Action::Cool { object: held, with },
                };
                return go_or(with, act);
            }
            if goal.kind == TaskKind::LookAtObjInLight {
                return go_or(finish, Action::UseLamp);
            }
            return put_down(state, held, finish);
        }
        return match here {
            Some(r) => put_down(state, held, r),
            None => Action::GoTo(finish),
        };
    }

    if let (Some(&object), Some(from)) = (state.wanted_here().first(), here) {
        return Action::Take { object, from };
    }
    if let Some(&(_, r)) = state.seen_elsewhere().first() {
        // Not visible from here means: elsewhere, or here behind a closed door.
        return go_or(r, Action::Open(r));
    }
    let unsearched = state.unsearched();
    if let Some(r) = here.filter(|r| unsearched.contains(r)) {
        return Action::Open(r);
    }
    match unsearched.first() {
        Some(&r) => Action::GoTo(r),
        // Unreachable while the target lies where the generator or the agent put it.
        None => Action::Look,
    }
}

/// Puts `held` at receptacle `at`: go there, open it if needed, put.
fn put_down(state: &State, held: usize, at: usize) -> Action {
    if state.location != Some(at) {
        Action::GoTo(at)
    } else if !state.reachable(at) {
        Action::Open(at)
    } else {
        Action::Put {
            object: held,
            to: at,
        }
    }
}

/// Plays the expert from the start of `state` and returns how many steps it needs, or `None`
/// if it has not solved the task after `cap` steps.
pub(crate) fn solution_length(mut state: State, cap: u32) -> Option<u32> {
    state.observe();
    for step in 1..=cap {
        let action = next_action(&state);
        crate::actions::apply(&mut state, action);
        state.observe();
        if state.solved() {
            return Some(step);
        }
    }
    None
}
